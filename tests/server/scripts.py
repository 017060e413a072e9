"""Tiny training jobs the server tests run as real processes."""

TRAIN = """
import json, os, pathlib, sys, time
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
run = os.environ["HAI_INSTANCE_ID"]
seen = {k: v for k, v in os.environ.items() if k.startswith(("HAI_", "CUDA_"))}
(model / f"env-{run}.tmp").write_text(json.dumps(seen))
os.replace(model / f"env-{run}.tmp", model / f"env-{run}.json")  # whole when the test reads it
(model / f"step-{run}.pt").write_text("weights")
print("training run", run, flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 60)
print("done", flush=True)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
"""

ELASTIC = """
import os, pathlib, sys, time
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
notice = pathlib.Path(os.environ["HAI_PREEMPT_NOTICE"])
import signal
signal.signal(signal.SIGTERM, lambda *a: None)  # save first, then leave
(model / "ready").write_text("")
while not notice.exists():
    time.sleep(0.05)
tmp = model / "final.pt.tmp"
tmp.write_text("saved on notice")
os.replace(tmp, model / "final.pt")
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the SIGTERM after the notice may land during teardown
sys.exit(0)
"""

SAVES_ON_SIGTERM = """
import os, pathlib, signal, sys, time
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
if os.environ["HAI_RESUME"] == "1":
    sys.exit(0)

def save_and_leave(signum, frame):
    time.sleep(1)  # a checkpoint being written
    tmp = model / "drain.pt.tmp"
    tmp.write_text("weights")
    os.replace(tmp, model / "drain.pt")
    sys.exit(75)

signal.signal(signal.SIGTERM, save_and_leave)
(model / "ready").write_text("")
time.sleep(60)
"""
