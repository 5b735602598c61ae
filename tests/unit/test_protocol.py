import pytest
import torch

from mmrl.models.encoding import EncodedPrompt
from mmrl.protocol import KNOWN_KEYS, Batch, balanced_sizes, sample_tokens


def make(n: int = 5) -> Batch:
    return Batch(
        tensors={"x": torch.arange(n * 2).view(n, 2), "y": torch.arange(n).float()},
        objects={"uid": [f"u{i}" for i in range(n)]},
        meta={"step": 3},
    )


def test_mismatched_sizes_are_refused():
    with pytest.raises(ValueError, match="disagree"):
        Batch(tensors={"x": torch.zeros(3)}, objects={"uid": ["a", "b"]})


def test_select_keeps_order_and_meta():
    b = make().select([4, 0, 2])
    assert b["x"].tolist() == [[8, 9], [0, 1], [4, 5]]
    assert b["uid"] == ["u4", "u0", "u2"]
    assert b.meta == {"step": 3}


def test_split_and_concat_round_trip():
    b = make(7)
    parts = b.split([3, 0, 4])
    assert [len(p) for p in parts] == [3, 0, 4]
    back = Batch.concat(parts)
    assert torch.equal(back["x"], b["x"]) and back["uid"] == b["uid"]
    with pytest.raises(ValueError, match="do not add up"):
        b.split([3, 3])


def test_chunk_uneven_sizes():
    assert balanced_sizes(7, 3) == [3, 2, 2]
    assert balanced_sizes(2, 3) == [1, 1, 0]
    chunks = make(7).chunk(3)
    assert [c["uid"] for c in chunks] == [["u0", "u1", "u2"], ["u3", "u4"], ["u5", "u6"]]


def test_repeat_interleaved_shares_objects():
    prompt = object()
    b = Batch(objects={"prompt": [prompt, object()]}, tensors={"y": torch.tensor([1.0, 2.0])})
    r = b.repeat(3)
    assert r["y"].tolist() == [1, 1, 1, 2, 2, 2]
    assert r["prompt"][0] is prompt and r["prompt"][2] is prompt
    assert make(2).repeat(2, interleave=False)["uid"] == ["u0", "u1", "u0", "u1"]


def test_union_merges_and_checks_conflicts():
    a = make(3)
    b = Batch(tensors={"z": torch.ones(3)}, objects={"uid": ["u0", "u1", "u2"]})
    u = a.union(b)
    assert set(u.keys()) == {"x", "y", "z", "uid"}
    with pytest.raises(ValueError, match="uid"):
        a.union(Batch(objects={"uid": ["a", "b", "c"]}))
    with pytest.raises(ValueError, match="sizes differ"):
        a.union(Batch(tensors={"z": torch.ones(2)}))


def test_concat_refuses_different_fields():
    with pytest.raises(ValueError, match="fields differ"):
        Batch.concat([make(2), Batch(tensors={"x": torch.zeros(1, 2)})])


def test_require_names_missing_field_and_its_meaning():
    with pytest.raises(KeyError, match="old_log_probs.*log-probs of the policy"):
        make().require("x", "old_log_probs")


def encoded(length: int) -> EncodedPrompt:
    ids = torch.zeros(length, dtype=torch.long)
    return EncodedPrompt(input_ids=ids, mm_token_type_ids=torch.zeros_like(ids))


def test_sample_tokens_counts_prompt_and_response_tokens():
    shared, other = encoded(10), encoded(4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    b = Batch(tensors={"response_mask": mask}, objects={"prompt": [shared, shared, other]})
    assert sample_tokens(b) == [13, 11, 8]
    assert sample_tokens(b.select_fields("prompt")) == [10, 10, 4]  # before rollout: prompt tokens only


def test_sample_tokens_weighs_one_per_sample_without_prompts():
    assert sample_tokens(make(3)) == [1, 1, 1]
    assert sample_tokens(Batch(objects={"messages": [[], []]})) == [1, 1]


def test_is_pad_is_a_known_key():
    assert "is_pad" in KNOWN_KEYS and "(B,) bool" in KNOWN_KEYS["is_pad"]
    with pytest.raises(KeyError, match="is_pad.*padding|is_pad.*DP_COMPUTE"):
        make().require("is_pad")
