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
# 11-18 s each on the 2-core box (Ray's workers start and load the model per run): CI's `-m ci` step
# runs them; the quick suite keeps the plain `--ray` run and the error paths
def slow_on_ray(test):
    return pytest.mark.ci(pytest.mark.slow(test))


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
    from flexlamps.settings import RunSettings

    return GenerateSettings(run=RunSettings.parse(str(model), dtype="auto", max_batch_size=3), max_new_tokens=6)  # as _args


def _run_api(model, prompts, out, on_shard):
    """The driver as the command runs it, with a hook after each recorded shard."""
    from flexlamps.distributed.cluster import ray_cluster
    from flexlamps.distributed.generate import generate_on_ray
    from flexlamps.generate_job import encode_checked, pending_job
    from flexlamps.models.loading.registry import open_checkpoint

    job = pending_job(_ray_settings(model), prompts, out)
    reader = open_checkpoint(model)
    ids = encode_checked(reader.tokenizer, reader.config.max_position, job.todo, False)
    job.results.open()

    def on_rows(rows, tokens):
        for row in rows:
            job.results.add(row)

    try:
        with ray_cluster(None, 2, 1) as slots:
            pool = generate_on_ray(_ray_settings(model), 1, slots, job.todo, ids, on_rows, on_shard=on_shard)
        job.results.finalize(job.order)
    finally:
        job.results.release()
    return pool


def test_generate_on_ray_writes_the_single_process_file(cluster, tiny_llama, prompts, reference, tmp_path):
    out = tmp_path / "ray.jsonl"
    res = CliRunner().invoke(main, _args(tiny_llama, prompts, out) + ["--ray", "--ray-workers", "2"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "ray: 2 workers x 1 threads (CPU) on " in res.output
    assert out.read_bytes() == reference.read_bytes()
    assert not (tmp_path / "ray.jsonl.partial").exists()


@slow_on_ray
def test_openai_batch_file_on_ray_writes_the_single_process_file(cluster, tiny_llama, tmp_path):
    """Chat and completions lines, a schema, n samples and a broken body, sharded over 2 workers."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"messages": chat + [{"role": "user", "content": WORDS[i]}], "n": 1 + i % 3, "temperature": 0.7,
                       "max_tokens": 30, **({"response_format": {"type": "json_schema", "json_schema": {
                           "name": "s", "schema": schema}}} if i % 2 else {})}} for i in range(5)]
    lines += [{"custom_id": "p", "method": "POST", "url": "/v1/completions", "body": {"prompt": "a", "max_tokens": 4}},
              {"custom_id": "broken", "method": "POST", "url": "/v1/completions", "body": {"prompt": 3}}]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(line) + "\n" for line in lines))
    ref, out = tmp_path / "ref.jsonl", tmp_path / "ray.jsonl"
    assert CliRunner().invoke(main, _args(tiny_llama, batch, ref), catch_exceptions=False).exit_code == 0
    res = CliRunner().invoke(main, _args(tiny_llama, batch, out) + ["--ray", "--ray-workers", "2"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert out.read_bytes() == ref.read_bytes()
    assert json.loads(out.read_text().splitlines()[-1])["error"]["code"] == "invalid_request"


@slow_on_ray
def test_killed_worker_is_replaced_and_its_shards_retried(cluster, tiny_llama, prompts, reference, tmp_path):
    """A worker process killed mid-run: its shards are retried on a fresh worker and the file is
    the single-process one. Deterministic: the worker killed is the one that ran the first recorded
    shard, so the next queued shard goes to it (the other still has 2 in flight) and fails there,
    whatever order the cluster finishes shards in."""
    seen = []

    def kill_once(pool, shard):
        seen.append(pool)
        if len(seen) == 1:  # 6 shards, 2 in flight per worker: 2 still queued
            os.kill(pool.workers[shard.worker].info["pid"], signal.SIGKILL)

    out = tmp_path / "ray.jsonl"
    _run_api(tiny_llama, prompts, out, kill_once)
    assert seen[0].replaced == 1
    assert out.read_bytes() == reference.read_bytes()


@slow_on_ray
def test_dead_driver_resumes_with_what_it_recorded(cluster, tiny_llama, prompts, reference, tmp_path):
    """The driver dies right after recording its second shard: re-running the command keeps the
    records it had written and computes only the rest. The count is the recorded shards' own
    (which two finish first is the cluster's to decide)."""
    sizes = []

    def die_after_two(pool, shard):
        sizes.append(len(shard.payload))
        if len(sizes) == 2:
            raise KeyboardInterrupt

    out = tmp_path / "ray.jsonl"
    with pytest.raises(KeyboardInterrupt):
        _run_api(tiny_llama, prompts, out, die_after_two)
    partial = [json.loads(ln) for ln in (tmp_path / "ray.jsonl.partial").read_text().splitlines()]
    done_before = len(partial)
    assert done_before == sum(sizes) and len({r["id"] for r in partial}) == done_before
    assert not out.exists()
    res = CliRunner().invoke(main, _args(tiny_llama, prompts, out) + ["--ray", "--ray-workers", "2"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert f"prompts {NUM_PROMPTS - done_before} (+{done_before} done before)" in res.output
    ids = [json.loads(ln)["id"] for ln in out.read_text().splitlines()]
    assert ids == [f"p{i}" for i in range(NUM_PROMPTS)]  # every id exactly once, in input order
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


TIMED = {"request_time", "request_datetime", "batch_request_time", "inference_runtime", "run_wall_time"}


def _is_timed(name) -> bool:
    return isinstance(name, str) and (name in TIMED or name.endswith("_per_second"))


def _untimed(obj):
    """A run file without what a clock decides (two single-process runs differ there too)."""
    if isinstance(obj, dict):
        name = obj.get("name")
        return {k: _untimed(v) for k, v in obj.items() if not _is_timed(k) and not (
            isinstance(name, dict) and _is_timed(name.get("name")))}
    if isinstance(obj, list):
        return [_untimed(v) for v in obj if not (isinstance(v, dict) and isinstance(v.get("name"), dict)
                                                 and _is_timed(v["name"].get("name")))]
    return obj


@slow_on_ray
def test_helm_on_ray_writes_the_single_process_run_folders(cluster, tiny_llama, tmp_path):
    from flexlamps.commands.helm import command as helm

    mc = tmp_path / "colors.jsonl"
    mc.write_text("".join(json.dumps({"question": f"Color number {i}?", "choices": ["red", "green", "blue"],
                                      "gold": i % 3}) + "\n" for i in range(5)))
    common = ["--model", str(tiny_llama), "--scenario", "demo", "--scenario-file", str(mc), "--suite", "s",
              "--batch-size", "4", "--max-tokens", "4", "--threads", "1"]  # as each worker: sums split over
    # threads may round differently
    folders = {}
    for name, extra in (("one", []), ("ray", ["--ray", "--ray-workers", "2"])):
        res = CliRunner().invoke(helm, common + ["--output-path", str(tmp_path / name)] + extra,
                                 catch_exceptions=False)
        assert res.exit_code == 0, res.output
        folders[name] = tmp_path / name / "runs" / "s"
    runs = sorted(p.name for p in folders["one"].iterdir() if p.is_dir())
    assert len(runs) == 2 and runs == sorted(p.name for p in folders["ray"].iterdir() if p.is_dir())
    for run in runs:
        files = sorted(p.name for p in (folders["one"] / run).iterdir() if p.suffix == ".json")
        assert files == sorted(p.name for p in (folders["ray"] / run).iterdir() if p.suffix == ".json")
        for f in files:
            one, on_ray = (json.loads((folders[k] / run / f).read_text()) for k in ("one", "ray"))
            assert _untimed(on_ray) == _untimed(one), f"{run}/{f}"
