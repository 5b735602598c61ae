"""MFU per phase: a phase's FLOPs (:mod:`mmrl.perf.flops`) over its seconds, against the measured peak.

``perf/mfu/<phase>`` = FLOPs / seconds / peak, where the peak is the sum of the group's ranks' large-matmul
FLOP/s measured at the run's start (:mod:`mmrl.perf.peak`; on one machine the ranks measure at the same time, so
they share its cores as they do in a step). ``perf/tflop/<phase>`` is the phase's FLOPs in 1e12. A phase is
reported when the step ran it and timed it: ``gen`` (the hybrid engine's generation, prompt encoding and
dispatch included), its parts ``gen/vision``, ``gen/prefill``, ``gen/decode`` when the engine timed them,
``old_log_prob``, ``ref``, ``update_actor``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mmrl.perf.peak import Peak


def group_peak(peaks: Sequence[Peak]) -> Peak:
    """The FLOP/s of a group's ranks together."""
    return Peak(large=sum(p.large for p in peaks), model=sum(p.model for p in peaks))


def peak_metrics(peak: Peak) -> dict[str, float]:
    """``perf/peak_tflops`` (the large matmul's) and ``perf/peak_tflops/model_shape`` (the model's matmul)."""
    return {"perf/peak_tflops": peak.large / 1e12, "perf/peak_tflops/model_shape": peak.model / 1e12}


def mfu_metrics(flops: Mapping[str, float], seconds: Mapping[str, float], peak: Peak) -> dict[str, float]:
    """``perf/mfu/<phase>`` and ``perf/tflop/<phase>`` of each phase in both ``flops`` and ``seconds``."""
    out = {}
    for phase, count in flops.items():
        took = seconds.get(phase, 0.0)
        if took > 0 and peak.large > 0:
            out[f"perf/mfu/{phase}"] = count / took / peak.large
            out[f"perf/tflop/{phase}"] = count / 1e12
    return out
