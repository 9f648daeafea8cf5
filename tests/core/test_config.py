"""Settings: code beats environment beats file; unknown keys and bad values are clear
errors; plugin options are typed."""

from __future__ import annotations

import pytest

import fiber
from fiber.backend.options import ConfigError, parse_memory
from fiber.runtime import config


def test_precedence_code_env_file(tmp_path, monkeypatch, fresh_config):
    cfgfile = tmp_path / "fiberconfig"
    cfgfile.write_text("[default]\ncpu = 2\nmemory = 1G\nimage = from-file\n")
    monkeypatch.setenv("FIBER_CONFIG_FILE", str(cfgfile))
    monkeypatch.setenv("FIBER_IMAGE", "from-env")
    config.reset()  # settings are cached per process; read them again
    cfg = config.get_config()
    assert (cfg.cpu, cfg.memory, cfg.image) == (2.0, 1024, "from-env")
    assert cfg.sources["cpu"] == str(cfgfile) and cfg.sources["image"] == "environment"
    cfg = fiber.init(image="from-code", memory="512M")
    assert (cfg.image, cfg.memory, cfg.sources["image"]) == ("from-code", 512, "code")
    assert cfg.child_env()["FIBER_IMAGE"] == "from-code"


def test_unknown_keys_are_errors_everywhere(tmp_path, monkeypatch, fresh_config):
    with pytest.raises(ConfigError, match="unknown setting 'imagee'.*did you mean 'image'"):
        fiber.init(imagee="x")
    monkeypatch.setenv("FIBER_NO_SUCH_THING", "1")
    with pytest.raises(ConfigError, match="FIBER_NO_SUCH_THING"):
        config.load()
    monkeypatch.delenv("FIBER_NO_SUCH_THING")
    bad = tmp_path / "bad"
    bad.write_text("[default]\nbakend = local\n")
    monkeypatch.setenv("FIBER_CONFIG_FILE", str(bad))
    with pytest.raises(ConfigError, match=f"unknown setting 'bakend' \\(from {bad}\\)"):
        config.load()


def test_bad_values_say_what_is_expected(monkeypatch, fresh_config):
    monkeypatch.setenv("FIBER_CPU", "lots")
    with pytest.raises(ConfigError, match="'lots' for setting 'cpu'"):
        config.load()
    monkeypatch.delenv("FIBER_CPU")
    with pytest.raises(ConfigError, match="expected one of"):
        fiber.init(log_level="LOUD")
    with pytest.raises(ConfigError, match="4G"):
        fiber.init(memory="four gigs")
    assert parse_memory("1.5Gi") == 1536 and parse_memory(300) == 300


def test_meta_sets_resources():
    @fiber.meta(cpu=2, memory="2G", gpu=1)
    def target():
        pass

    assert target.__fiber_meta__ == {"cpu": 2.0, "memory": 2048, "gpu": 1}
    with pytest.raises(ValueError):
        fiber.meta(cpu=-1)


def test_backend_selected_by_environment(monkeypatch, fresh_config):
    monkeypatch.setenv("FIBER_BACKEND", "example-missing")
    from fiber.backend import registry

    with pytest.raises(registry.BackendNotFoundError, match="example-missing"):
        fiber.Process(target=print).start()


# -- the edges a new user meets: each a ConfigError that names the file or variable
def test_config_file_variable_must_name_a_file(tmp_path, monkeypatch, fresh_config):
    missing = tmp_path / "nonexistent"
    monkeypatch.setenv("FIBER_CONFIG_FILE", str(missing))
    with pytest.raises(ConfigError, match=f"FIBER_CONFIG_FILE names {missing}, which does "
                       "not exist: create it .* or unset FIBER_CONFIG_FILE"):
        config.load()
    monkeypatch.setenv("FIBER_CONFIG_FILE", str(tmp_path))
    with pytest.raises(ConfigError, match=f"FIBER_CONFIG_FILE names {tmp_path}, which is a "
                       "directory: name a file"):
        config.load()
    monkeypatch.setenv("FIBER_CONFIG_FILE", "")  # empty: as if unset
    monkeypatch.delenv("FIBER_BACKEND", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./.fiberconfig
    monkeypatch.setenv("HOME", str(tmp_path))  # nor ~/.fiberconfig
    assert config.load().sources["backend"] == "default"


def test_config_file_that_is_not_utf8_is_named(tmp_path, monkeypatch, fresh_config):
    latin = tmp_path / ".fiberconfig"
    latin.write_bytes("[default]\nimage = caf\u00e9\n".encode("latin-1"))
    monkeypatch.setenv("FIBER_CONFIG_FILE", str(latin))
    with pytest.raises(ConfigError, match=f"cannot read {latin}: it is not UTF-8 text "
                       r"\(byte 0xe9 at offset 21\); save it as UTF-8"):
        config.load()
    latin.write_text("[default]\nimage = caf\u00e9\n", encoding="utf-8")
    assert config.load().image == "caf\u00e9"


def test_config_file_found_in_working_directory_not_utf8(tmp_path, monkeypatch,
                                                          fresh_config):
    monkeypatch.delenv("FIBER_CONFIG_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".fiberconfig").write_bytes(b"[default]\nimage = \xff\n")
    with pytest.raises(ConfigError, match=r"\.fiberconfig: it is not UTF-8 text"):
        config.load()


def test_empty_variable_is_unset(monkeypatch, fresh_config):
    monkeypatch.setenv("FIBER_BACKEND", "")
    monkeypatch.setenv("FIBER_CPU", "")
    cfg = config.load()
    assert (cfg.backend, cfg.sources["backend"]) == ("local", "default")
    assert (cfg.cpu, cfg.sources["cpu"]) == (None, "default")
    monkeypatch.setenv("FIBER_NO_SUCH_THING", "")  # still a typo worth reporting
    with pytest.raises(ConfigError, match="FIBER_NO_SUCH_THING"):
        config.load()


def test_file_values_may_be_quoted(tmp_path, monkeypatch, fresh_config):
    cfgfile = tmp_path / "fiberconfig"
    cfgfile.write_text("[default]\nbackend = \"local\"\nimage = 'my image'\nmemory =\n")
    monkeypatch.setenv("FIBER_CONFIG_FILE", str(cfgfile))
    monkeypatch.delenv("FIBER_BACKEND", raising=False)
    cfg = config.load()
    assert (cfg.backend, cfg.image, cfg.memory) == ("local", "my image", None)
    assert cfg.sources["backend"] == str(cfgfile) and cfg.sources["memory"] == "default"


def test_file_without_a_section_header_says_what_to_do(tmp_path, monkeypatch,
                                                        fresh_config):
    """As a file with another section does: the fix, where the first setting is, and
    none of configparser's own wording."""
    cfgfile = tmp_path / "fiberconfig"
    cfgfile.write_text("# my settings\nbackend = local\ncpu = 2\n")
    monkeypatch.setenv("FIBER_CONFIG_FILE", str(cfgfile))
    with pytest.raises(ConfigError) as caught:
        config.load()
    message = str(caught.value)
    assert message.startswith(f"{cfgfile}, line 2: 'backend = local' comes before any "
                              "section header: put settings under a [default] section")
    assert "File contains no section headers" not in message


@pytest.mark.parametrize("line", ['backend = "local', "image = my-image'",
                                  "image = 'a\"", 'cpu = "'])
def test_unbalanced_quote_is_an_error_naming_file_and_line(tmp_path, monkeypatch,
                                                           fresh_config, line):
    cfgfile = tmp_path / "fiberconfig"
    cfgfile.write_text(f"[other]\nbackend = x\n\n[default]\nmemory = 1G\n{line}\n")
    monkeypatch.setenv("FIBER_CONFIG_FILE", str(cfgfile))
    monkeypatch.delenv("FIBER_BACKEND", raising=False)
    monkeypatch.delenv("FIBER_IMAGE", raising=False)
    key = line.split()[0]
    with pytest.raises(ConfigError, match=rf"^{cfgfile}, line 6: the value of '{key}' .* "
                       "unbalanced quote .*: put the value between two quotes or none\n"
                       # pytest matches the exception's notes too: its troubleshooting entry
                       r"troubleshooting: docs/troubleshooting\.md#configerror$"):
        config.load()
