"""mmrl.installer: pip's configuration becomes the same uv flags."""

from mmrl.installer import parse_pip_config, uv_flags

LISTING = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.find-links='/opt/wheels'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.constraint='/etc/xdg/pip/constraints.txt'
global.index-url='https://mirror.example/simple'
not a setting line
"""


def test_parse_pip_config_splits_multi_valued_settings():
    settings = parse_pip_config(LISTING)
    assert settings["extra-index-url"] == ["file:///opt/pypi/simple", "file:///opt/pypi-more/simple"]
    assert settings["find-links"] == ["/opt/wheels"]
    assert settings["cert"] == ["/etc/ssl/certs/ca-certificates.crt"]
    assert len(settings) == 5


def test_uv_flags_reproduce_every_index_and_constraint():
    flags = uv_flags(parse_pip_config(LISTING))
    pairs = list(zip(flags[::2], flags[1::2]))
    assert ("--default-index", "https://mirror.example/simple") in pairs
    assert ("--index", "file:///opt/pypi/simple") in pairs and ("--index", "file:///opt/pypi-more/simple") in pairs
    assert ("--find-links", "/opt/wheels") in pairs
    assert ("--constraint", "/etc/xdg/pip/constraints.txt") in pairs
    assert flags[-2:] == ["--index-strategy", "unsafe-best-match"]
    assert "--no-index" not in flags
    assert "--no-index" in uv_flags(parse_pip_config("global.no-index='true'"))


def test_uv_compiles_the_bytecode_at_install_time(tmp_path, monkeypatch):
    """Where PYTHONDONTWRITEBYTECODE is set nothing else writes it: every process would compile torch anew."""
    import mmrl.installer as installer

    python = tmp_path / "bin" / "python"
    monkeypatch.setattr(installer, "find_uv", lambda python: "/opt/uv")
    monkeypatch.setattr(installer, "pip_settings", lambda python: {})
    monkeypatch.delenv("MMRL_INSTALLER", raising=False)
    command = installer.install_command(["torch==2.13.0"], python=str(python))
    assert command[:3] == ["/opt/uv", "pip", "install"] and "--compile-bytecode" in command
    assert command[-1] == "torch==2.13.0"
    monkeypatch.setenv("MMRL_INSTALLER", "pip")
    assert installer.install_command(["torch==2.13.0"], python=str(python))[1:4] == ["-m", "pip", "install"]
