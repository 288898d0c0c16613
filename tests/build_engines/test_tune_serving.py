"""`python -m build_engines tune` on a real tritonserver, over a model whose best shape is known.

The model (written into the test's own repository) sleeps a fixed overhead per call plus a cost per row, and
sleeping takes no core: bigger batches always win (the overhead is paid per call) and so do more instances
(they sleep side by side). With --max-batch-size 16 and --cores 2 the best shape is 16 rows and 2
instances, and the real command must find it within a small budget and write it into config.pbtxt.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

from build_engines.cli import main
from build_engines.tune_config import parse, shape_of

CONFIG = """\
# Test model: each call sleeps OVERHEAD_S plus SECONDS_PER_ROW per row it carries.
name: "slow_batcher"
backend: "python"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
# Merges what the clients keep in flight.
dynamic_batching {
  max_queue_delay_microseconds: 1000
}
instance_group [
  {
    # One instance to start from.
    kind: KIND_CPU
    count: 1
  }
]
parameters [
  { key: "OVERHEAD_S", value: { string_value: "0.05" } },
  { key: "SECONDS_PER_ROW", value: { string_value: "0.0005" } }
]
"""

MODEL = """\
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.overhead = float(parameters["OVERHEAD_S"]["string_value"])
        self.per_row = float(parameters["SECONDS_PER_ROW"]["string_value"])

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        time.sleep(self.overhead + self.per_row * sum(a.shape[0] for a in arrays))
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", a)]) for a in arrays]
"""


def test_tune_finds_the_known_best_shape_and_writes_it(tmp_path: Path):
    model = tmp_path / "models" / "slow_batcher"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(MODEL)
    out = tmp_path / "out"
    argv = ["tune", str(model), "--out", str(out), "--write", "--cores", "2", "--max-batch-size", "16"]
    argv += ["--budget-s", "24", "--warmup-s", "0.2", "--measure-s", "0.4"]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == 0
    printed = stdout.getvalue()

    assert re.search(r"^\[1/\d+\] batch=8 delay=1000us preferred=- inst=1 threads=-: [\d.]+ rows/s p95 \d+ ms \(baseline\)$",
                     printed, re.MULTILINE), printed  # fmt: skip
    last = printed.strip().splitlines()[-1]
    line = re.fullmatch(
        r'TUNE model=slow_batcher baseline_rows_per_s=([\d.]+) best_rows_per_s=([\d.]+) gain=([\d.]+) chosen="(.+)"',
        last,
    )
    assert line, last
    assert line.group(4).startswith("batch=16 ") and " inst=2 " in line.group(4), printed
    # 8-row calls on one instance against 16-row calls on two: about 3.7x (50 ms a call is the most of its cost).
    assert float(line.group(3)) > 1.5, printed

    written = (model / "config.pbtxt").read_text()
    shape = shape_of(parse(written))
    assert (shape.max_batch_size, shape.instances) == (16, 2)
    for comment in ("# Merges what the clients keep in flight.", "    # One instance to start from."):
        assert comment in written

    record = json.loads((out / "tune.json").read_text())
    assert record["machine"]["cores"] == 2
    assert record["trials"][0]["note"] == "baseline" and record["trials"][1]["note"] == "baseline, repeated"
    assert record["chosen"]["shape"]["max_batch_size"] == 16 and record["written"] is True
    assert all(t["shape"]["instances"] <= 2 for t in record["trials"])
    # Two python-backend instances: two stub processes hold the chosen config's memory.
    assert record["memory"]["children"] == 2 and record["memory"]["per_instance_bytes"] > 10 * 1024**2


def test_a_model_that_does_not_load_is_one_error_line(tmp_path: Path):
    model = tmp_path / "models" / "slow_batcher"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(
        MODEL.replace("parameters = ", "raise RuntimeError('no weights here')\n        parameters = ")
    )
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = main(["tune", str(model), "--out", str(tmp_path / "out"), "--warmup-s", "0", "--measure-s", "0.2"])
    assert code == 1
    assert stderr.getvalue().startswith("error: the current config does not serve: load failed: "), stderr.getvalue()
    assert "Traceback" not in stderr.getvalue()
    assert (model / "config.pbtxt").read_text() == CONFIG
