"""The built-in prompt set and the prompt-file loaders (formats, detection, and clear rejections)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from specdec.bench.prompts import PROMPT_TYPES, load_builtin, parse_types
from specdec.prompts import Prompt, PromptFileError, read_prompts

EXPECTED_TYPES = (
    "repetitive",
    "repetitive_pattern",
    "dialogue",
    "wikipedia_style",
    "natural",
    "technical",
    "technical_ml",
    "code",
    "code_python",
    "code_json",
    "creative_fiction",
    "list_items",
)


def _write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    p = tmp_path / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content, encoding="utf-8")
    return p


def _jsonl(*records: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


# ------------------------------------------------------------------------------------------ built-in set


def test_prompt_types_are_the_twelve_in_order():
    assert PROMPT_TYPES == EXPECTED_TYPES


def test_builtin_covers_exactly_the_types_with_at_least_five_each():
    prompts = load_builtin()
    counts = Counter(p.type for p in prompts)
    assert set(counts) == set(PROMPT_TYPES)
    assert all(n >= 5 for n in counts.values()), counts
    assert all(isinstance(p, Prompt) for p in prompts)


def test_builtin_ids_unique_and_texts_nonempty():
    prompts = load_builtin()
    ids = [p.id for p in prompts]
    assert len(ids) == len(set(ids))
    for p in prompts:
        assert p.text.strip(), p.id
        assert p.text == p.text.strip(), f"{p.id} has leading/trailing whitespace"
        assert p.id.startswith(p.type + "-"), p.id


def test_builtin_primary_prompt_is_first_and_medium_length():
    primaries = load_builtin(per_type=1)
    assert [p.type for p in primaries] == list(PROMPT_TYPES)
    for p in primaries:
        assert p.id == f"{p.type}-01"
        approx_tokens = max(len(p.text.split()) * 1.3, len(p.text) / 4)
        assert 55 <= approx_tokens <= 160, (p.id, approx_tokens)


def test_builtin_lengths_vary():
    prompts = load_builtin()
    words = {t: [len(p.text.split()) for p in prompts if p.type == t] for t in PROMPT_TYPES}
    for t, w in words.items():
        assert max(w) >= 2 * min(w), (t, w)  # short and long within every type
    everything = [n for w in words.values() for n in w]
    assert min(everything) <= 20
    assert max(everything) >= 130


def test_builtin_type_order_and_per_type():
    got = load_builtin(["code_json", "repetitive"], per_type=2)
    assert [p.id for p in got] == ["code_json-01", "code_json-02", "repetitive-01", "repetitive-02"]
    # a string is parsed like --types; repeats collapse
    assert load_builtin("natural,natural", per_type=1) == load_builtin(["natural"], per_type=1)
    assert len(load_builtin(["dialogue"])) >= 5


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_builtin_rejects_bad_per_type(bad):
    with pytest.raises(ValueError, match="per_type"):
        load_builtin(per_type=bad)


def test_builtin_unknown_type_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown prompt type") as info:
        load_builtin(["code", "poetry"])
    assert "poetry" in str(info.value)
    assert all(t in str(info.value) for t in PROMPT_TYPES)
    with pytest.raises(ValueError):
        load_builtin([])


# ------------------------------------------------------------------------------------------- parse_types


def test_parse_types():
    assert parse_types("all") == list(PROMPT_TYPES)
    assert parse_types(" ALL ") == list(PROMPT_TYPES)
    assert parse_types("code") == ["code"]
    assert parse_types(" code , natural,code,") == ["code", "natural"]


@pytest.mark.parametrize("arg", ["", " , ", "poetry", "code,poetry", "Code"])
def test_parse_types_errors(arg):
    with pytest.raises(ValueError) as info:
        parse_types(arg)
    assert "valid types" in str(info.value)
    assert "\n" not in str(info.value)


# -------------------------------------------------------------------------------------- file formats ok


def test_jsonl_with_type_and_category(tmp_path):
    path = _write(
        tmp_path,
        "mine.jsonl",
        _jsonl(
            {"id": "a", "type": "code", "prompt": "def f(x):"},
            {"category": "math", "prompt": "1 + 1 ="},
            {"type": "math", "prompt": "2 + 2 ="},
        ),
    )
    got = read_prompts(path)
    assert got == [
        Prompt("a", "code", "def f(x):"),
        Prompt("math-01", "math", "1 + 1 ="),
        Prompt("math-02", "math", "2 + 2 ="),
    ]


def test_jsonl_detected_from_content_not_extension(tmp_path):
    content = "\n" + _jsonl({"type": "t", "prompt": "hello"}) + "\n\n"
    got = read_prompts(_write(tmp_path, "prompts.txt", content))
    assert got == [Prompt("t-01", "t", "hello")]


def test_jsonl_keeps_text_verbatim_and_int_ids(tmp_path):
    text = "line one\n\n    indented line two  "
    got = read_prompts(_write(tmp_path, "p.jsonl", _jsonl({"id": 7, "type": "x", "prompt": text})))
    assert got == [Prompt("7", "x", text)]


def test_spec_bench_question_jsonl_uses_first_turn(tmp_path):
    path = _write(
        tmp_path,
        "question.jsonl",
        _jsonl(
            {"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now make it rhyme."]},
            {"question_id": 82, "category": "math", "turns": ["What is 17 * 3?"]},
        ),
    )
    got = read_prompts(path)
    assert got == [Prompt("81", "writing", "Write a haiku."), Prompt("82", "math", "What is 17 * 3?")]


def test_json_array_accepted(tmp_path):
    content = json.dumps([{"type": "a", "prompt": "x"}, {"type": "a", "prompt": "y"}], indent=2)
    got = read_prompts(_write(tmp_path, "p.json", content))
    assert [p.id for p in got] == ["a-01", "a-02"]


def test_plain_text_blocks(tmp_path):
    content = "First prompt,\nstill the first.\n\n\n   \nSecond prompt.\n\nThird {not json}\n"
    got = read_prompts(_write(tmp_path, "p.txt", content))
    assert got == [
        Prompt("custom-01", "custom", "First prompt,\nstill the first."),
        Prompt("custom-02", "custom", "Second prompt."),
        Prompt("custom-03", "custom", "Third {not json}"),
    ]


def test_plain_text_starting_with_brace_but_not_json(tmp_path):
    content = "{\n  this is a code block, not JSON\n}\n\nint main(void) {"
    got = read_prompts(_write(tmp_path, "p.txt", content))
    assert [p.text for p in got] == ["{\n  this is a code block, not JSON\n}", "int main(void) {"]


def test_utf8_bom_and_crlf(tmp_path):
    content = "\ufeff" + '{"type": "t", "prompt": "caf\\u00e9"}\r\n'
    assert read_prompts(_write(tmp_path, "p.jsonl", content)) == [Prompt("t-01", "t", "café")]
    plain = "one\r\n\r\ntwo\r\n"
    assert [p.text for p in read_prompts(_write(tmp_path, "q.txt", plain))] == ["one", "two"]


# ---------------------------------------------------------------------------------------- bad files


def _rejects(path, *needles: str) -> str:
    with pytest.raises(PromptFileError) as info:
        read_prompts(path)
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert str(path) in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def test_prompt_file_error_is_value_error():
    assert issubclass(PromptFileError, ValueError)


def test_missing_file(tmp_path):
    _rejects(tmp_path / "nope.jsonl", "no such")


def test_directory(tmp_path):
    _rejects(tmp_path, "directory")


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path, content):
    _rejects(_write(tmp_path, "e.jsonl", content), "empty")
    _rejects(_write(tmp_path, "e.txt", content), "empty")


def test_unknown_record_format(tmp_path):
    path = _write(tmp_path, "p.jsonl", _jsonl({"type": "a", "prompt": "ok"}, {"text": "x", "label": 1}))
    _rejects(path, "line 2", "unknown record format", "label, text")


def test_binary_file(tmp_path):
    _rejects(_write(tmp_path, "p.bin", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), "binary")
    _rejects(_write(tmp_path, "q.txt", b"caf\xe9 au lait\n"), "UTF-8")


def test_invalid_json_line_names_line_number(tmp_path):
    content = _jsonl({"type": "a", "prompt": "fine"}) + "\n" + '{"type": "a", "prompt": "oops",}\n'
    _rejects(_write(tmp_path, "p.jsonl", content), "line 3", "invalid JSON")


def test_invalid_json_first_line_of_jsonl_file(tmp_path):
    _rejects(_write(tmp_path, "p.jsonl", '{"type": "a", "prompt": \n'), "line 1", "invalid JSON")


def test_invalid_json_document(tmp_path):
    _rejects(_write(tmp_path, "p.json", '[\n  {"type": "a", "prompt": "x"},\n  oops\n]'), "line 3")


def test_non_object_line(tmp_path):
    content = _jsonl({"type": "a", "prompt": "x"}) + '["a", "b"]\n'
    _rejects(_write(tmp_path, "p.jsonl", content), "line 2", "JSON object")


@pytest.mark.parametrize("prompt", ["", "   \n "])
def test_empty_prompt(tmp_path, prompt):
    _rejects(_write(tmp_path, "p.jsonl", _jsonl({"type": "a", "prompt": prompt})), "line 1", "empty prompt")


def test_empty_spec_bench_turn(tmp_path):
    content = _jsonl({"question_id": 1, "category": "c", "turns": [""]})
    _rejects(_write(tmp_path, "q.jsonl", content), "empty prompt")
    content = _jsonl({"question_id": 1, "category": "c", "turns": []})
    _rejects(_write(tmp_path, "r.jsonl", content), "turns")


def test_non_string_prompt_and_empty_type(tmp_path):
    _rejects(_write(tmp_path, "p.jsonl", _jsonl({"type": "a", "prompt": 3})), "string")
    _rejects(_write(tmp_path, "q.jsonl", _jsonl({"type": " ", "prompt": "x"})), "type")


def test_duplicate_ids(tmp_path):
    content = _jsonl(
        {"id": "x", "type": "a", "prompt": "1"},
        {"id": "y", "type": "a", "prompt": "2"},
        {"id": "x", "type": "a", "prompt": "3"},
    )
    _rejects(_write(tmp_path, "p.jsonl", content), "duplicate id 'x'", "line 3", "line 1")


def test_generated_id_colliding_with_explicit_one(tmp_path):
    content = _jsonl({"id": "a-01", "type": "b", "prompt": "1"}, {"type": "a", "prompt": "2"})
    _rejects(_write(tmp_path, "p.jsonl", content), "duplicate id 'a-01'")


def test_single_pretty_printed_object_rejected(tmp_path):
    content = json.dumps({"type": "a", "prompt": "x"}, indent=2)
    _rejects(_write(tmp_path, "p.txt", content), "JSON Lines")


# -- C30: one prompts file, one meaning, at every entry point ---------------------------------------------


@pytest.mark.parametrize("name,content", [
    ("multi.txt", "def fib(n):\n    return n\n\n\nsecond prompt\nstill the second\n"),
    ("lines.txt", '{"prompt": "alpha beta", "type": "code"}\n{"prompt": "gamma\\ndelta", "max_new_tokens": 2}\n'),
    ("bom.jsonl", '\ufeff{"prompt": "with a byte-order mark"}\n'),
    ("array.data", '[{"prompt": "one"}, {"prompt": "two"}]'),
])
def test_sweep_and_generate_read_the_same_prompts(tiny_pair, tmp_path, capsys, name, content):
    """``specdec sweep --prompts F`` (its plan's prompts) and ``specdec generate --prompts-file F`` (the prompts
    it continued, in its JSON document) read the same prompts from the same file, whatever its suffix."""
    import json

    from specdec.bench import sweep as S
    from specdec.bench.plan import select_prompts
    from specdec.entrypoints.cli import main

    path = _write(tmp_path, name, content)
    swept = [p.text for p in select_prompts(S.make_config({"prompts": str(path), "target": str(tiny_pair.target_dir)}))]
    with pytest.raises(SystemExit) as done:
        main(["generate", "--target", str(tiny_pair.target_dir), "--prompts-file", str(path), "--drafter", "ngram",
              "--k", "1", "--max-new-tokens", "1", "--dtype", "float32", "--threads", "1", "--json"])
    assert done.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["prompt"] for r in doc["rows"]] == swept and len(swept) == (2 if name != "bom.jsonl" else 1)


def test_a_json_line_in_a_plain_text_file_is_refused_never_taken_literally(tmp_path):
    path = _write(tmp_path, "mixed.txt", 'a plain first prompt\n\n{"prompt": "then JSON"}\n')
    with pytest.raises(PromptFileError, match=r"line 3 is a JSON object, but the file is read as plain text"):
        read_prompts(path)
