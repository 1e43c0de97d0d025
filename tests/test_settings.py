import argparse
import json

import pytest

from ddtree_chat import settings as st
from ddtree_chat.modes import MAX_REPEAT_PENALTY


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DDTREE_CHAT_HOME", str(tmp_path))
    return tmp_path


def test_missing_file_gives_defaults_without_warning():
    s, warning = st.load()
    assert s == st.Settings() and warning is None


def test_roundtrip(home):
    s = st.Settings(system="be brief", temperature=0.7, top_p=0.9, repeat_penalty=1.3, max_new_tokens=64, mode="dflash",
                    budget=32, thinking=False, seed=3)
    path = st.save(s)
    assert path.parent == home / "config"
    assert st.load() == (s, None)


def test_a_file_from_before_repeat_penalty_loads_with_it_off():
    st.settings_path().write_text(json.dumps({"temperature": 0.4, "top_p": 0.9, "seed": 2}), encoding="utf-8")
    assert st.load() == (st.Settings(temperature=0.4, top_p=0.9, seed=2), None)
    assert st.load()[0].repeat_penalty == 1.0


def test_corrupt_file_warns_and_uses_defaults():
    st.settings_path().write_text("{not json", encoding="utf-8")
    s, warning = st.load()
    assert s == st.Settings()
    assert "not valid JSON" in warning


def test_bad_values_are_dropped_with_warning():
    st.settings_path().write_text(json.dumps({"temperature": "hot", "budget": 8, "colour": 1}), encoding="utf-8")
    s, warning = st.load()
    assert s.budget == 8 and s.temperature == st.Settings().temperature
    assert "temperature" in warning and "colour" in warning


@pytest.mark.parametrize(
    "name,value,expected",
    [("temperature", "0.5", 0.5), ("top_p", "1", 1.0), ("repeat_penalty", "1", 1.0), ("repeat_penalty", "1.1", 1.1),
     ("repeat_penalty", 10, 10.0), ("max_new_tokens", "12", 12), ("mode", "AR", "ar"),
     ("thinking", "off", False), ("thinking", "on", True), ("budget", 256, 256), ("budget", "auto", "auto"),
     ("budget", "1", 1), ("context", "8192", 8192), ("context", None, None), ("device", "cuda", "cuda"),
     ("model", "/models/kimi", "/models/kimi")],
)
def test_validate_accepts(name, value, expected):
    assert st.validate(name, value) == expected


@pytest.mark.parametrize(
    "name,value",
    [("temperature", "-1"), ("temperature", "nan"), ("top_p", "0"), ("top_p", "1.5"), ("repeat_penalty", "0.9"),
     ("repeat_penalty", "10.5"), ("repeat_penalty", "nan"), ("repeat_penalty", "x"), ("repeat_penalty", True),
     ("max_new_tokens", "0"),
     ("max_new_tokens", "1.5"), ("mode", "beam"), ("thinking", "maybe"), ("budget", "x"), ("budget", "1024"),
     ("budget", "-1"), ("budget", "0"), ("context", "0"), ("context", "-5"), ("context", "4k"), ("device", "tpu"),
     ("model", ""), ("draft", 3), ("nope", 1)],
)
def test_validate_rejects(name, value):
    with pytest.raises(st.SettingsError):
        st.validate(name, value)


def test_cli_overrides_only_given_values():
    base = st.Settings(temperature=0.3, budget=8)
    args = argparse.Namespace(temperature=None, budget=64, mode="ar", system=None, top_p=None, repeat_penalty=None,
                              max_new_tokens=None, seed=None, thinking=None)
    s, warnings = st.with_overrides(base, args)
    assert (s.temperature, s.budget, s.mode, s.repeat_penalty) == (0.3, 64, "ar", 1.0) and warnings == []
    s, warnings = st.with_overrides(base, argparse.Namespace(repeat_penalty=1.5))
    assert (s.temperature, s.repeat_penalty) == (0.3, 1.5) and warnings == []


def test_cli_thinking_default_does_not_override_saved_off():
    base = st.Settings(thinking=False)
    assert st.with_overrides(base, argparse.Namespace(thinking=True))[0].thinking is False
    assert st.with_overrides(st.Settings(), argparse.Namespace(thinking=False))[0].thinking is False


def test_cli_bad_value_is_a_warning_and_others_still_apply():
    s, warnings = st.with_overrides(st.Settings(), argparse.Namespace(temperature=-2.0, budget=32))
    assert s.budget == 32 and s.temperature == 0.0 and "temperature" in warnings[0]


def test_settings_know_the_engine_limits():
    """What the CLI and the TUI accept (settings.validate) is what the engine accepts for a ddtree round: the
    same modes and the same budget range at both ends."""
    from ddtree_chat.engine import GenerationConfig
    from ddtree_chat.modes import BUDGETS, MAX_BUDGET, MODES

    for mode in MODES:
        assert st.validate("mode", mode) == mode and GenerationConfig(mode=mode).mode == mode
    assert st.validate("budget", MAX_BUDGET) == GenerationConfig(budget=MAX_BUDGET).budget == MAX_BUDGET
    with pytest.raises(st.SettingsError):
        st.validate("budget", MAX_BUDGET + 1)
    with pytest.raises(ValueError):
        GenerationConfig(budget=MAX_BUDGET + 1)
    low = BUDGETS.start
    assert st.validate("budget", low) == GenerationConfig(mode="ddtree", budget=low).budget == low
    with pytest.raises(st.SettingsError):
        st.validate("budget", low - 1)
    with pytest.raises(ValueError):
        GenerationConfig(mode="ddtree", budget=low - 1)
    for value in (1, MAX_REPEAT_PENALTY):
        assert st.validate("repeat_penalty", value) == GenerationConfig(repeat_penalty=value).repeat_penalty == value
    for value in (0.99, MAX_REPEAT_PENALTY + 0.01):
        with pytest.raises(st.SettingsError):
            st.validate("repeat_penalty", value)
        with pytest.raises(ValueError):
            GenerationConfig(repeat_penalty=value)


@pytest.mark.parametrize("name,value", [("temperature", "nan"), ("top_p", "0"), ("top_p", "1.5"), ("repeat_penalty", "0.5"),
                                        ("context", "0")])
def test_rejections_name_the_setting_and_the_value(name, value):
    with pytest.raises(st.SettingsError, match=rf"^{name} .*'{value}'"):
        st.validate(name, value)


def test_repeat_penalty_rejection_is_one_sentence_with_its_range():
    for value in ("0.5", "11", "lots"):
        with pytest.raises(st.SettingsError) as err:
            st.validate("repeat_penalty", value)
        assert str(err.value) == f"repeat_penalty must be from 1 to 10, not '{value}'."


def test_engine_config_names_the_bad_value():
    from ddtree_chat.engine import GenerationConfig

    with pytest.raises(ValueError, match="temperature must be >= 0, not nan"):
        GenerationConfig(temperature=float("nan"))
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], not 1.5"):
        GenerationConfig(top_p=1.5)


def _args(model=None, draft=None, device=None, context=None):
    return argparse.Namespace(model=model, draft=draft, device=device, context=context)


def test_model_choice_flag_over_environment_over_file():
    saved = st.Settings(model="/saved/m", draft="/saved/d", device="cpu", context=2048)
    env = {st.ENV_MODEL: "/env/m", st.ENV_DRAFT: "/env/d"}
    assert st.load_choice(_args(), saved, {}) == dict(model="/saved/m", draft="/saved/d", device="cpu", context=2048)
    from_env = st.load_choice(_args(), saved, env)
    assert (from_env["model"], from_env["draft"], from_env["context"]) == ("/env/m", "/env/d", 2048)
    chosen = st.load_choice(_args(model="/flag/m", device="cuda", context=512), saved, env)
    assert chosen == dict(model="/flag/m", draft=None, device="cuda", context=512)


def test_the_drafter_goes_with_its_model():
    saved = st.Settings(model="/saved/m", draft="/saved/d")
    # a model named by the environment never borrows the drafter saved for another model
    assert st.load_choice(_args(), saved, {st.ENV_MODEL: "/env/m"})["draft"] is None
    # --draft alone replaces the saved model's drafter
    assert st.load_choice(_args(draft="/flag/d"), saved, {}) == dict(model="/saved/m", draft="/flag/d", device=None,
                                                                      context=None)
    assert st.load_choice(_args(), st.Settings(), {})["model"] is None  # the demo pair


def test_model_choice_is_saved_and_read_back():
    s = st.Settings(model="/models/kimi", draft="/models/kimi-dflash", device="cuda", context=65536)
    st.save(s)
    assert st.load() == (s, None)


def test_the_seed_is_random_by_default_and_a_reply_draws_its_own():
    """"random" (the default, any case) or a number; a reply's settings carry a drawn number, a set one is kept; a
    --seed random flag wins over a saved number."""
    assert st.Settings().seed == st.RANDOM_SEED and st.validate("seed", " Random ") == st.RANDOM_SEED
    with pytest.raises(st.SettingsError, match="or random"):
        st.validate("seed", "lucky")
    drawn = {st.with_seed(st.Settings()).seed for _ in range(20)}
    assert len(drawn) > 1 and all(isinstance(x, int) and 0 <= x < 2**31 for x in drawn)
    assert st.with_seed(st.Settings(seed=7)).seed == 7
    s, warnings = st.with_overrides(st.Settings(seed=7), argparse.Namespace(seed=st.validate("seed", "random")))
    assert s.seed == st.RANDOM_SEED and warnings == []

