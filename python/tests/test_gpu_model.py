"""kvferry.gpu_model and kvferry.gpu_check: a Llama over a paged KV cache, on the CPU with host
memory (the reference engine's /dev/shm kind) and, where CUDA is, on the GPU through CUDA IPC. They
need PyTorch (CI installs Debian's python3-torch); without it every test here is skipped with that
reason. The Llama is transformers' where transformers is installed (a GPU host), else
kvferry.torch_llama's (CI: Debian packages no transformers); the MLA model is transformers' only,
so its cases skip without it. The GPU run with numbers is scripts/gpu-model.sh on a GPU host."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip(
    "torch", reason="kvferry.gpu_model needs PyTorch (not installed here; on a GPU host: scripts/gpu-model.sh)")

from kvferry.gpu_model import (  # noqa: E402
    ModelEngine, ModelSpec, PagedKvCache, build_model, have_transformers, model_source)
from tests.cluster import Node, needs_node  # noqa: E402

needs_transformers = pytest.mark.skipif(
    not have_transformers(), reason="the MLA model is transformers' DeepseekV3ForCausalLM; transformers is "
                                    "not installed here (Debian packages none; a GPU host has it)")
SMALL = ModelSpec(layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=64, vocab=256, seed=7)
SMALL_MLA = ModelSpec(arch="mla", layers=2, heads=4, head_dim=16, intermediate=64, vocab=256, seed=7,
                      kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)
PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_host_cache_is_shared_memory_in_vllms_layout():
    cache = PagedKvCache(SMALL, 8, 16, torch.device("cpu"))
    try:
        m = cache.port_memory()
        assert m["kind"] == "host"
        assert [layer["length"] for layer in m["layers"]] == [2 * 8 * 16 * 2 * 16 * 2] * SMALL.layers
        assert cache.port_geometry() == {"layout": "standard", "num_blocks": 8, "block_size": 16,
                                         "kv_heads": 2, "head_dim": 16, "dtype_bytes": 2}
        assert oct(os.stat(cache.shm_path).st_mode & 0o777) == "0o600"
    finally:
        cache.close()
    assert not os.path.exists(cache.shm_path)


def test_mla_cache_is_vllms_latent_layout():
    cache = PagedKvCache(SMALL_MLA, 8, 16, torch.device("cpu"))
    try:
        assert cache.port_geometry() == {"layout": "mla", "num_blocks": 8, "block_size": 16, "latent": 40,
                                         "dtype_bytes": 2}
        assert [layer["length"] for layer in cache.port_memory()["layers"]] == [8 * 16 * 40 * 2] * SMALL_MLA.layers
        assert tuple(cache.kv.shape) == (2, 8, 16, 40)
    finally:
        cache.close()


def test_an_unknown_architecture_is_refused():
    with pytest.raises(ValueError, match="arch"):
        ModelSpec(arch="gpt")


def test_an_unknown_way_of_marking_saves_is_refused_by_its_name(monkeypatch):
    """KVFERRY_SAVE_MARKS picks how a GPU engine marks saved layers (layer, the default, or step);
    anything else stops the engine at once, naming the variable and the value."""
    dev = torch.device("cpu")
    model = build_model(SMALL, dev)
    cache = PagedKvCache(SMALL, 16, 16, dev)
    try:
        monkeypatch.setenv("KVFERRY_SAVE_MARKS", "steps")
        with pytest.raises(ValueError, match="KVFERRY_SAVE_MARKS must be layer or step, not 'steps'"):
            ModelEngine(model, SMALL, cache, role="decode", mode="write", chunk_tokens=16)
        monkeypatch.delenv("KVFERRY_SAVE_MARKS")
        assert ModelEngine(model, SMALL, cache, role="decode", mode="write", chunk_tokens=16).save_marks == "layer"
    finally:
        cache.close()


@pytest.mark.parametrize("spec", [SMALL, pytest.param(SMALL_MLA, marks=needs_transformers)], ids=["llama", "mla"])
def test_the_paged_forward_follows_the_models_own_forward(spec):
    """The paged attention is the model's attention: its last logits match the model's own forward
    of the whole prompt up to bf16 rounding of the cached KV (not bitwise: other kernels)."""
    dev = torch.device("cpu")
    model = build_model(spec, dev)
    cache = PagedKvCache(spec, 16, 16, dev)
    try:
        e = ModelEngine(model, spec, cache, role="decode", mode="write", chunk_tokens=16)
        prompt = [3 + (i * 53) % 250 for i in range(37)]
        out = e.prefill("r", prompt, None, finish=False)
        paged, _ = e.first_token("r", prompt, out["blocks"], remote=False)
        with torch.inference_mode():
            full = model(input_ids=torch.tensor([prompt])).logits[0, -1]
        a, b = paged.float(), full.float()
        cos = torch.nn.functional.cosine_similarity(a, b, dim=0)
        assert cos > 0.999, f"cosine {cos:.6f}; max abs diff {float((a - b).abs().max()):.4g}"
    finally:
        cache.close()


@pytest.mark.parametrize("spec", [SMALL, pytest.param(SMALL_MLA, marks=needs_transformers)], ids=["llama", "mla"])
def test_the_same_work_on_other_blocks_gives_the_same_kv_logits_and_tokens(spec):
    dev = torch.device("cpu")
    model = build_model(spec, dev)
    caches = [PagedKvCache(spec, 64, 16, dev) for _ in range(2)]
    try:
        a = ModelEngine(model, spec, caches[0], role="decode", mode="write", chunk_tokens=16)
        b = ModelEngine(model, spec, caches[1], role="decode", mode="write", chunk_tokens=16)
        prompt = [3 + (i * 37) % 250 for i in range(40)]
        pa = a.prefill("a", prompt, None, finish=False)
        b.pool.allocate(5)  # b's blocks are other ids: only the block table may differ
        pb = b.prefill("b", prompt, None, chunks=[tuple(c) for c in pa["chunks"]], finish=False)
        assert pa["blocks"] != pb["blocks"]
        assert torch.equal(caches[0].gather(pa["blocks"], 0, 40).view(torch.int16),
                           caches[1].gather(pb["blocks"], 0, 40).view(torch.int16))
        la, blocks_a = a.first_token("a", prompt, pa["blocks"], remote=False)
        lb, blocks_b = b.first_token("b", prompt, pb["blocks"], remote=False)
        assert torch.equal(la.view(torch.int16), lb.view(torch.int16))
        ta, _ = a.decode("a", prompt, blocks_a, la, 6)
        tb, _ = b.decode("b", prompt, blocks_b, lb, 6)
        assert ta == tb and len(ta) == 7
    finally:
        for c in caches:
            c.close()


needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA here: CUDA graphs run on a GPU host (scripts/gpu-pytest.sh)")


def test_cuda_graphs_are_refused_for_a_host_cache():
    dev = torch.device("cpu")
    cache = PagedKvCache(SMALL, 8, 16, dev)
    try:
        with pytest.raises(ValueError, match="cuda_graphs needs the KV cache on a GPU"):
            ModelEngine(build_model(SMALL, dev), SMALL, cache, role="decode", mode="write", cuda_graphs=True)
    finally:
        cache.close()


def test_the_check_refuses_cuda_graphs_on_the_cpu():
    from kvferry.gpu_check import parse_args

    sockets = ["--p-socket", "p.sock", "--d-socket", "d.sock"]
    with pytest.raises(SystemExit) as e:
        parse_args([*sockets, "--p-device", "cpu", "--d-device", "cpu", "--cuda-graphs", "on"])
    assert e.value.code == 2
    # By default: graphs where both engines are on GPUs, none on the CPU; off turns them off.
    assert parse_args([*sockets, "--p-device", "cpu", "--d-device", "cpu"]).cuda_graphs is False
    assert parse_args([*sockets, "--p-device", "cuda:0", "--d-device", "cpu"]).cuda_graphs is False
    assert parse_args([*sockets, "--p-device", "cuda:0", "--d-device", "cuda:1"]).cuda_graphs is True
    assert parse_args([*sockets, "--cuda-graphs", "off"]).cuda_graphs is False


@needs_cuda
@pytest.mark.parametrize("spec", [SMALL, pytest.param(SMALL_MLA, marks=needs_transformers)], ids=["llama", "mla"])
def test_a_graphed_step_gives_the_eager_steps_bits_on_any_blocks(spec):
    """The first step of a shape runs eager and captures; later ones replay with their own tokens
    and block tables: logits and written KV bit for bit those of eager forward() on the same work,
    each replay its own output (not the graph's buffer, which the next replay overwrites)."""
    dev = torch.device("cuda:0")
    model = build_model(spec, dev)
    eager_cache, graph_cache = PagedKvCache(spec, 64, 16, dev), PagedKvCache(spec, 64, 16, dev)
    eager = ModelEngine(model, spec, eager_cache, role="decode", mode="write", chunk_tokens=16)
    graphed = ModelEngine(model, spec, graph_cache, role="decode", mode="write", chunk_tokens=16, cuda_graphs=True)
    outs = []
    for i, shift in enumerate((0, 5, 11)):  # other block ids each time: only the table differs
        prompt = [3 + (j * (37 + i)) % 250 for j in range(40)]
        graphed.pool.allocate(shift)
        pe = eager.prefill(f"e{i}", prompt, None, finish=False)
        pg = graphed.prefill(f"g{i}", prompt, None, chunks=[tuple(c) for c in pe["chunks"]], finish=False)
        le, be = eager.first_token(f"e{i}", prompt, pe["blocks"], remote=False)
        lg, bg = graphed.first_token(f"g{i}", prompt, pg["blocks"], remote=False)
        assert torch.equal(le.view(torch.int16), lg.view(torch.int16)), i
        assert torch.equal(eager_cache.gather(be, 0, 40).view(torch.int16),
                           graph_cache.gather(bg, 0, 40).view(torch.int16)), i
        outs.append(lg)
        eager.pool.free(be)
        graphed.pool.free(bg)
    (g,) = graphed.runner._graphs.values()  # one shape: captured once, replayed twice
    assert g.replays == 2
    assert not torch.equal(outs[1], outs[2])  # each replay's logits are its own copy


def _start_nodes(tmp_path, extra: list[str]) -> list[Node]:
    """A P and a D node on engine ports (sockets prefill.sock, decode.sock), D seeded by P."""
    p = Node(str(tmp_path), "prefill", engine_id="prefill-0", socket_path=str(tmp_path / "prefill.sock"),
             extra_args=extra)
    d = Node(str(tmp_path), "decode", engine_id="decode-0", socket_path=str(tmp_path / "decode.sock"),
             seed_port=p.port, extra_args=extra)
    return [p, d]


def _stop(nodes: list[Node]) -> None:
    for n in nodes:
        n.stop()


def _gpu_check(tmp_path, dev: str, *flags: str) -> subprocess.CompletedProcess:
    # This package first, then whatever the caller put on the path (a GPU host's run that hides
    # transformers puts its stand-in there).
    python_path = os.pathsep.join(d for d in (PYTHON_DIR, os.environ.get("PYTHONPATH")) if d)
    return subprocess.run(
        [sys.executable, "-c", "import sys; from kvferry.gpu_check import main; sys.exit(main(sys.argv[1:]))",
         "--p-socket", str(tmp_path / "prefill.sock"), "--d-socket", str(tmp_path / "decode.sock"),
         "--p-device", dev, "--d-device", dev, *flags],
        env={**os.environ, "PYTHONPATH": python_path}, capture_output=True, text=True, timeout=600)


@pytest.mark.node
@needs_node
@pytest.mark.parametrize("arch", ["llama", pytest.param("mla", marks=needs_transformers)])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_disaggregated_decoding_is_bit_identical_to_the_engine_without_kvferry(tmp_path, device, arch):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA here: the GPU part (CUDA IPC memory and events) runs on a GPU host with "
                    "scripts/gpu-model.sh P_GPU D_GPU")
    gpu = ["--gpu", "0", "--transport", "cuda"] if device == "cuda" else ["--transport", "cma"]
    procs = _start_nodes(tmp_path, gpu)
    try:
        out = _gpu_check(tmp_path, "cuda:0" if device == "cuda" else "cpu",
                         "--prompts", "4", "--max-prompt-tokens", "600",
                         "--decode-steps", "4", "--layers", "2", "--num-blocks", "1024", "--ttft-reps", "0",
                         "--no-generate", "--no-mla-probe", "--arch", arch, "--json", str(tmp_path / "report.json"),
                         "--torch-threads", "2")
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
        assert "KV equal byte for byte 4/4; first-token logits bitwise equal 4/4" in out.stdout, out.stdout
        assert f"built by {model_source(ModelSpec(arch=arch))}" in out.stdout, out.stdout
        # Both engine processes took the asked thread count (the default is 1, as vLLM).
        engines = next(line for line in out.stdout.splitlines() if line.startswith("P: "))
        assert engines.count("'torch_threads': 2") == 2, engines
        # CUDA graphs by default where both engines are on GPUs, never on the CPU.
        assert engines.count(f"'cuda_graphs': {device == 'cuda'}") == 2, engines
    finally:
        _stop(procs)


@pytest.mark.node
@needs_node
@needs_cuda
def test_the_check_and_its_ttft_with_cuda_graphs(tmp_path):
    """The check with every engine's last-prompt-token step as a CUDA graph: prompts of one length
    replay the graph that length's first prompt captured, in D's engine and in the engine without
    kvferry alike, and the bits still agree; the TTFT path replays too."""
    procs = _start_nodes(tmp_path, ["--gpu", "0", "--transport", "cuda"])
    try:
        # --max-prompt-tokens 16: every prompt has the shortest length, so all but the first replay.
        out = _gpu_check(tmp_path, "cuda:0", "--prompts", "6", "--max-prompt-tokens", "16", "--decode-steps", "4",
                         "--layers", "2", "--num-blocks", "1024", "--ttft-lengths", "64", "--ttft-reps", "3",
                         "--ttft-warmup", "1", "--no-generate", "--no-mla-probe", "--cuda-graphs", "on",
                         "--json", str(tmp_path / "report.json"))
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
        equal = re.findall(r"first-token logits bitwise equal (\d+)/(\d+)", out.stdout)
        assert equal and all(a == b and int(b) >= 2 for a, b in equal), out.stdout
        assert "TTFT write n=64 paired" in out.stdout, out.stdout
    finally:
        _stop(procs)


@pytest.mark.node
@needs_node
def test_time_to_first_token_runs_on_the_cpu_with_its_diagnostics(tmp_path):
    """The TTFT path (paired estimates, parts, timeline) on the CPU with host memory, with D's
    baseline idling in its kvferry engine's steps before its first token (a diagnostic): the
    numbers mean nothing here, the path and its report do."""
    procs = _start_nodes(tmp_path, ["--transport", "cma"])
    try:
        out = _gpu_check(tmp_path, "cpu", "--prompts", "1", "--max-prompt-tokens", "64", "--modes", "write",
                         "--decode-steps", "2", "--layers", "2", "--num-blocks", "256", "--no-generate",
                         "--no-mla-probe", "--ttft-lengths", "64", "--ttft-reps", "2", "--ttft-warmup", "1",
                         "--ttft-baseline-idle-steps-ms", "2", "--json", str(tmp_path / "report.json"))
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
        assert "TTFT write n=64 paired, added, without = D's process:" in out.stdout, out.stdout
        medians = next(line for line in out.stdout.splitlines() if "TTFT write n=64 medians:" in line)
        idle = float(medians.split("baseline_idle_steps ")[1].split(",")[0])
        assert idle >= 1, medians  # each baseline first token came after at least one idle step
    finally:
        _stop(procs)
