"""Hostile and careless config files (issue 38, items 7-9): one line and exit status 2 for a file nested
10,000 levels deep, a 50 MB file, a huge value (named, not repeated) and a key given twice (both values
and the file named); no shipped or ClipBERT config has a key twice."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from clipbert_legacy.config import ConfigError, parse_args, parse_args_or_exit
from clipbert_legacy.config.json_file import MAX_CONFIG_BYTES, MAX_DEPTH, load_json_object
from clipbert_legacy.modeling.build import load_model_config
from clipbert_legacy.utils.errors import LINE_CHARS, clip, one_line, shown

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path, text, name="c.json"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def one_config_error(argv):
    """The entry point's stderr line and exit status for ``argv`` (the real process: a RecursionError
    would show as a traceback and exit 1). ClipBERT's script path, which reads the config before it imports
    torch and the model (``python -m clipbert_legacy.tasks.run_x`` imports them first, then reads it)."""
    proc = subprocess.run([sys.executable, "src/tasks/run_video_retrieval.py", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stderr.strip().splitlines()


def test_a_config_nested_10000_levels_is_one_line_exit_2(tmp_path):
    p = write(tmp_path, '{"fps": ' + "[" * 10000 + "]" * 10000 + "}")
    rc, lines = one_config_error(["--config", p])
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0] == (f"config error: --config {p!r}: nested too deeply to parse; a config needs at most a "
                        f"few levels (this project reads up to {MAX_DEPTH})")


def test_nesting_within_what_json_parses_is_bounded_too(tmp_path):
    p = write(tmp_path, '{"train_datasets": ' + "[" * 200 + "]" * 200 + "}")
    with pytest.raises(ConfigError, match=f"nested more than {MAX_DEPTH} levels deep"):
        parse_args("retrieval", ["--config", p])
    ok = write(tmp_path, json.dumps({"train_datasets": [{"name": "d", "img": "/i", "txt": {"a": "/t"}}]}),
               "ok.json")
    assert parse_args("retrieval", ["--config", ok]).train_datasets[0].txt.a == "/t"


def test_a_huge_value_is_named_not_repeated(tmp_path, capsys, monkeypatch):
    p = write(tmp_path, json.dumps({"learning_rate": "9" * 1_000_000}))
    with pytest.raises(SystemExit) as e:
        parse_args_or_exit("retrieval", ["--config", p])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and len(err) < 400, err[:500]
    assert err.strip() == (f"config error: learning_rate='{'9' * 100}'... (1000000 chars) (c.json) is "
                           "invalid: expected float > 0")
    # also from the command line, in a dataset entry, as an unknown key and in $CLIPBERT_OVERRIDES
    cases = [(["--learning_rate", "x" * 100_000], "learning_rate=" + "x" * 100 + "... (100000 chars)"),
             (["--config", write(tmp_path, json.dumps({"y" * 200_000: 1}), "k.json")],
              f"unknown option '{'y' * 100}'... (200000 chars) in "),
             (["--config", write(tmp_path, json.dumps({"train_datasets": ["n" * 5000]}), "d.json")],
              "train_datasets[0]='" + "n" * 100 + "'... (5000 chars) (d.json) is invalid"),
             (["--" + "z" * 50_000], "command line: unknown option '--" + "z" * 98 + "'... (50002 chars)")]
    for argv, part in cases:
        with pytest.raises(ConfigError) as e:
            parse_args("retrieval", argv)
        assert part in str(e.value) and len(str(e.value)) < 400, str(e.value)[:500]
    monkeypatch.setenv("CLIPBERT_OVERRIDES", '--seed "' + "1" * 10_000)
    with pytest.raises(ConfigError, match=r"^\$CLIPBERT_OVERRIDES='--seed \"1+'\.\.\. \(10008 chars\): "
                                          "No closing"):
        parse_args("retrieval", [])


def test_a_50_mb_config_is_refused_unread(tmp_path):
    p = tmp_path / "big.json"
    with open(p, "w") as f:
        f.write('{"learning_rate": "')
        f.write("9" * (50 * 2 ** 20))
        f.write('"}')
    rc, lines = one_config_error(["--config", str(p)])
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0] == (f"config error: --config {str(p)!r}: {p.stat().st_size} bytes, more than a config "
                        f"file may have ({MAX_CONFIG_BYTES} bytes); is it the right file?")


def test_a_key_given_twice_is_refused_with_both_values(tmp_path):
    p = write(tmp_path, '{"fps": 2, "learning_rate": 1e-4, "num_frm": 2, "learning_rate": 5e-5}')
    rc, lines = one_config_error(["--config", p])
    assert rc == 2 and lines == [f"config error: --config {p!r}: key 'learning_rate' is given twice (0.0001 "
                                 "and then 5e-05); keep one"]
    nested = write(tmp_path, json.dumps({"train_datasets": [{"name": "a", "img": "/i", "txt": "/t"}]})
                   .replace('"img": "/i"', '"img": "/i", "img": "/other"'), "n.json")
    with pytest.raises(ConfigError, match=r"n.json': key 'img' is given twice \('/i' and then '/other'\)"):
        parse_args("retrieval", ["--config", nested])


def _json_files():
    return sorted(p for d in ("configs", "tests/data/clipbert_configs") for p in (REPO / d).rglob("*.json"))


@pytest.mark.parametrize("path", _json_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_shipped_or_clipbert_config_has_a_key_twice(path):
    data = load_json_object(str(path))  # raises on a duplicate key, at any depth
    assert data == json.loads(path.read_text(encoding="utf-8-sig"))


def test_model_config_is_read_within_the_same_limits(tmp_path):
    p = write(tmp_path, '{"hidden_size": 64, "hidden_size": 128}', "model.json")
    with pytest.raises(ConfigError, match="model_config .*model.json': key 'hidden_size' is given twice"):
        load_model_config(p)


def test_errors_clip_what_they_repeat():
    assert shown("abc") == "'abc'" and shown([1, "a"]) == '[1, "a"]'
    assert shown("a" * 101) == f"'{'a' * 100}'... (101 chars)"
    assert clip("line1\nline2") == "line1\\nline2" and clip("b" * 150, 10) == "bbbbbbbbbb... (150 chars)"
    long = one_line(ValueError("head " + "x" * 20_000 + " the fix"))
    assert len(long) <= LINE_CHARS + 60 and long.startswith("ValueError: head xxx")
    assert long.endswith(" the fix")
