#!/usr/bin/env python3
"""Runs train.py once per --config (same seed, data and tokenizer) and keeps
the run with the lowest loss on valid.txt (the held-out books play no part in
the choice).  The winner's checkpoint and eval files are copied to --out, and
its eval/training.json gets a "sweep" entry with every run's numbers.

  python3 tools/train/sweep.py --data .train-data --out models/kjv-moe \
      --config "--dropout 0.1 --steps 600" --config "--dropout 0.2 --steps 800"

Extra arguments after the options go to every run (e.g. --eval-every 25).
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "generation_config.json", "eval/reference_ppl.json", "eval/reference_greedy.json",
         "eval/training.json", "eval/heldout.txt"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=".train-data")
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="/tmp/kjv-sweep")
    p.add_argument("--config", action="append", required=True)
    a, common = p.parse_known_args()
    here = os.path.dirname(os.path.abspath(__file__))
    runs = []
    for i, conf in enumerate(a.config):
        d = os.path.join(a.work, f"run{i}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        cmd = [sys.executable, os.path.join(here, "train.py"), "--data", a.data, "--out", d] + common + shlex.split(conf)
        print(f"sweep: run {i}: {conf}", flush=True)
        t = time.time()
        with open(os.path.join(d, "log.txt"), "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1")).returncode
        tj = os.path.join(d, "eval", "training.json")
        if rc or not os.path.exists(tj):
            with open(os.path.join(d, "log.txt")) as f:
                print(f.read()[-3000:])
            print(f"sweep: run {i} failed (exit {rc})", flush=True)
            continue
        with open(tj) as f:
            s = json.load(f)
        runs.append({"run": i, "config": conf, "dir": d, "best_valid_loss": s["best_valid_loss"],
                     "best_step": s["best_step"], "steps_run": s["steps_run"],
                     "train_seconds": s["train_seconds"], "heldout_ppl_quantized": s["heldout_ppl_quantized"],
                     "heldout_ppl_float": s["heldout_ppl_float"], "greedy_text": s["greedy_text"],
                     "curve": s["curve"]})
        print(f"sweep: run {i}: best valid {s['best_valid_loss']:.4f} at step {s['best_step']}/{s['steps_run']}, "
              f"held-out PPL {s['heldout_ppl_quantized']:.2f} (float {s['heldout_ppl_float']:.2f}), "
              f"{s['train_seconds']:.0f} s training, {time.time() - t:.0f} s in all; {s['greedy_text']!r}", flush=True)
    if not runs:
        sys.exit("sweep: every run failed")
    best = min(runs, key=lambda r: r["best_valid_loss"])
    print(f"sweep: keeping run {best['run']} ({best['config']})", flush=True)
    for fn in FILES:
        dst = os.path.join(a.out, fn)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(os.path.join(best["dir"], fn), dst)
    tj = os.path.join(a.out, "eval", "training.json")
    with open(tj) as f:
        s = json.load(f)
    s["sweep"] = {"chosen": best["run"], "by": "lowest best_valid_loss",
                  "runs": [{k: v for k, v in r.items() if k != "dir"} for r in runs]}
    with open(tj, "w") as f:
        json.dump(s, f, indent=2)
        f.write("\n")
    with open(os.path.join(best["dir"], "log.txt")) as f:
        print(f.read()[-6000:])


if __name__ == "__main__":
    main()
