"""`--ray` on a local Ray cluster started here (2 CPUs, shared by the module): outputs equal the
single-process run, a killed worker's shard is retried, a dead driver's run resumes, and a
missing Ray or a bad address is a clear error."""

import json
import os
import signal
import sys

import pytest
from click.testing import CliRunner

from flexlamps.cli import main

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'flexlamps[ray]'")

WORDS = ["the quick brown fox", "hello world", "numbers 1 2 3", "Once upon a time", "a tiny model", "punctuation !?"]
NUM_PROMPTS = 16


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, object_store_memory=100 * 2**20, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray_prompts") / "in.jsonl"
    with open(path, "w") as fh:
        for i in range(NUM_PROMPTS):
            fh.write(json.dumps({"id": f"p{i}", "prompt": WORDS[i % len(WORDS)] + f" {i}", "tag": i % 3}) + "\n")
    return path


def _args(model, prompts, out):
    return ["generate", "--no-progress", "--model", str(model), "--prompts", str(prompts), "--out", str(out),
            "--max-new-tokens", "6", "--batch-size", "3", "--threads", "1"]


@pytest.fixture(scope="module")
def reference(tiny_llama, prompts, tmp_path_factory):
    """The single-process output file."""
    out = tmp_path_factory.mktemp("ray_ref") / "ref.jsonl"
    res = CliRunner().invoke(main, _args(tiny_llama, prompts, out), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return out


def _ray_settings(model):
    from flexlamps.generate_job import GenerateSettings

    return GenerateSettings(model=str(model), batch_size=3, max_new_tokens=6)


def _run_api(model, prompts, out, on_shard):
    """The driver as the command runs it, with a hook after each recorded shard."""
    from flexlamps.distributed.cluster import ray_cluster
    from flexlamps.distributed.generate import generate_on_ray
    from flexlamps.generate_job import encode_checked, pending_job
    from flexlamps.models.registry import open_checkpoint

    job = pending_job(prompts, out)
    reader = open_checkpoint(model)
    ids = encode_checked(reader.tokenizer, reader.config.max_position, job.todo, False)
    job.results.open()

    def on_rows(rows, tokens):
        for row in rows:
            job.results.add(row)

    try:
        with ray_cluster(None, 2, 1) as slots:
            pool = generate_on_ray(_ray_settings(model), 1, slots, job.todo, ids, on_rows, on_shard=on_shard)
    finally:
        job.results.close()
    job.results.finalize(job.order)
    return pool


def test_generate_on_ray_writes_the_single_process_file(cluster, tiny_llama, prompts, reference, tmp_path):
    out = tmp_path / "ray.jsonl"
    res = CliRunner().invoke(main, _args(tiny_llama, prompts, out) + ["--ray", "--ray-workers", "2"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "ray: 2 workers x 1 threads (CPU)" in res.output
    assert out.read_bytes() == reference.read_bytes()
    assert not (tmp_path / "ray.jsonl.partial").exists()


def test_killed_worker_shard_is_retried(cluster, tiny_llama, prompts, reference, tmp_path):
    killed = []

    def kill_other_worker(pool, shard):
        if not killed:  # the other worker still holds shards in flight
            victim = next(w for w in pool.workers if w.info["pid"] != os.getpid())
            killed.append(victim.info["pid"])
            os.kill(victim.info["pid"], signal.SIGKILL)

    out = tmp_path / "ray.jsonl"
    pool = _run_api(tiny_llama, prompts, out, kill_other_worker)
    ids = [json.loads(ln)["id"] for ln in out.read_text().splitlines()]
    assert ids == [f"p{i}" for i in range(NUM_PROMPTS)]  # every id exactly once, in input order
    assert out.read_bytes() == reference.read_bytes()
    assert killed and pool.replaced == 1


def test_dead_driver_rerun_keeps_finished_records(cluster, tiny_llama, prompts, reference, tmp_path):
    def die(pool, shard):
        raise KeyboardInterrupt  # the driver stops right after recording its first shard

    out = tmp_path / "ray.jsonl"
    with pytest.raises(KeyboardInterrupt):
        _run_api(tiny_llama, prompts, out, die)
    partial = (tmp_path / "ray.jsonl.partial").read_text()
    done_before = partial.count("\n")
    assert 1 <= done_before < NUM_PROMPTS and not out.exists()
    res = CliRunner().invoke(main, _args(tiny_llama, prompts, out) + ["--ray", "--ray-workers", "2"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert f"prompts {NUM_PROMPTS - done_before} (+{done_before} done before)" in res.output
    assert out.read_bytes() == reference.read_bytes()


def test_bad_address_is_a_clear_error(tiny_llama, prompts, tmp_path, monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a fresh process
    res = CliRunner().invoke(main, _args(tiny_llama, prompts, tmp_path / "o.jsonl") + ["--ray", "127.0.0.1:9"])
    assert res.exit_code != 0
    assert "cannot reach a Ray cluster at 127.0.0.1:9" in res.output and "ray start --head" in res.output
    res = CliRunner().invoke(main, _args(tiny_llama, prompts, tmp_path / "o.jsonl") + ["--ray", "nohost"])
    assert res.exit_code != 0 and "give HOST:PORT" in res.output
    assert not (tmp_path / "o.jsonl").exists()


def test_missing_ray_says_how_to_install(tiny_llama, prompts, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    res = CliRunner().invoke(main, _args(tiny_llama, prompts, tmp_path / "o.jsonl") + ["--ray"])
    assert res.exit_code != 0 and "pip install 'flexlamps[ray]'" in res.output
