#!/usr/bin/env python3
"""Soak test for `mlxcel serve` (Python standard library only).

Starts the server on a model, then for --duration seconds keeps --clients
clients sending a mix of requests: chat and completions, streamed and not,
/tokenize and /detokenize, deliberately bad requests, and streams that the
client drops midway.  Meanwhile it samples the server's resident memory,
threads and open file descriptors.  At the end it reports, per request type,
the count, the status codes and the p50/p99 latency; whether every 200 was
well-formed; RSS at the start, after the warm-up and at the end; and whether
the temperature-0 answers to fixed prompts are the same before and after.

    python3 tools/soak.py --duration 3600 --clients 3          # the demo model
    python3 tools/soak.py -m ../shared/fixtures/qwen2_moe_tiny_chat --duration 600

Exit status 0 when the run is clean: no unexpected status, no malformed
response, no client error, the same temperature-0 answers, RSS growth after
the warm-up under --max-growth percent, and the server stopping cleanly on
SIGTERM.  --json FILE also writes the numbers as JSON."""
import argparse
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROMPTS = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed are the meek"]
CHAT_MESSAGES = [
    [{"role": "user", "content": "Who made the heaven and the earth?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is light?"}],
    [{"role": "user", "content": "Tell me of Moses."}, {"role": "assistant", "content": "He led Israel."},
     {"role": "user", "content": "And then?"}],
]
FINISH = {"stop", "length", "tool_calls"}


# ---- the server ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args):
        self.port = free_port()
        cmd = [args.bin, "serve", "-m", args.model, "--port", str(self.port), "--parallel",
               str(args.parallel), "--ctx-size", str(args.ctx), "--quiet"]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        self.log = open(args.log, "wb") if args.log else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"soak: the server exited at start (status {self.proc.returncode})")
            try:
                st, _ = request(self.port, "GET", "/health", None, timeout=2)
                if st == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.proc.kill()
        raise SystemExit("soak: the server did not become healthy in 120 s")

    def sample(self):
        """(rss, threads, open fds, anonymous rss) of the server process.
        RSS counts the mmap'ed weights' pages as they are first read (an
        expert routed to for the first time late in a run adds its pages);
        the anonymous part is what a leak would grow."""
        pid = self.proc.pid
        rss = threads = anon = 0
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1]) * 1024
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
        return rss, threads, len(os.listdir(f"/proc/{pid}/fd")), anon

    def stop(self):
        """SIGTERM, then the exit status (None when it had to be killed)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def request(port, method, path, body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


# ---- checking responses ----

def check_completion(kind, raw):
    """'' when a non-streamed 200 body is well-formed, else what is wrong."""
    try:
        j = json.loads(raw)
    except ValueError:
        return "not JSON"
    ch = j.get("choices")
    if not isinstance(ch, list) or not ch:
        return "no choices"
    for c in ch:
        if c.get("finish_reason") not in FINISH:
            return f"finish_reason {c.get('finish_reason')!r}"
        text = c.get("message", {}).get("content") if kind == "chat" else c.get("text")
        if not isinstance(text, str):
            return "no text"
    u = j.get("usage", {})
    if not all(isinstance(u.get(k), int) for k in ("prompt_tokens", "completion_tokens", "total_tokens")):
        return "usage"
    return ""


def read_stream(resp, kind, stop_after=None):
    """Reads an SSE stream: (problem or '', number of events).  With
    stop_after, returns after that many events (the caller drops it)."""
    events, done, finished = 0, False, False
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line:
            continue
        if not line.startswith(b"data: "):
            return f"line {line[:40]!r}", events
        payload = line[6:]
        if payload == b"[DONE]":
            done = True
            break
        try:
            j = json.loads(payload)
        except ValueError:
            return "event not JSON", events
        if "error" in j:
            return f"error event {j['error'].get('code')}", events
        events += 1
        for c in j.get("choices", []):
            if c.get("finish_reason") is not None:
                if c["finish_reason"] not in FINISH:
                    return f"finish_reason {c['finish_reason']!r}", events
                finished = True
            if kind == "chat" and not isinstance(c.get("delta"), dict):
                return "no delta", events
        if stop_after is not None and events >= stop_after:
            return "", events
    if not done or not finished:
        return "stream ended without finish_reason and [DONE]", events
    return "", events


# ---- the load ----

class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_type = {}

    def add(self, kind, status, latency, problem="", expected=True):
        with self.lock:
            t = self.by_type.setdefault(kind, {"n": 0, "status": {}, "lat": [], "malformed": [],
                                               "unexpected": 0, "client_errors": []})
            t["n"] += 1
            t["status"][str(status)] = t["status"].get(str(status), 0) + 1
            t["lat"].append(latency)
            if problem:
                t["malformed"].append(problem)
            if not expected:
                t["unexpected"] += 1


BAD = [  # (body or raw bytes, path, statuses it may get)
    (b"{not json", "/v1/chat/completions", {400}),
    ({"messages": "hello"}, "/v1/chat/completions", {400}),
    ({"messages": []}, "/v1/chat/completions", {400}),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}, "/v1/chat/completions", {400}),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "/v1/chat/completions", {400}),
    ({"prompt": "x", "logit_bias": {"99999999": 1}}, "/v1/completions", {400}),
    ({"prompt": "x" * 40000}, "/v1/completions", {400}),          # longer than the context
    ({"prompt": "x", "grammar": "root ::= undefined-rule"}, "/v1/completions", {400}),
    ({"tokens": [-1]}, "/detokenize", {400}),
    ({"content": 5}, "/tokenize", {400}),
    ({"prompt": "x"}, "/v1/nowhere", {404}),
]


def client(port, stats, deadline, seed, max_tokens):
    rnd = random.Random(seed)
    kinds = ["chat", "chat_stream", "completion", "completion_stream", "tokenize", "detokenize", "bad",
             "aborted_stream"]
    weights = [3, 3, 3, 3, 2, 2, 2, 2]
    while time.time() < deadline:
        kind = rnd.choices(kinds, weights)[0]
        t0 = time.time()
        try:
            run_one(port, stats, kind, rnd, max_tokens, t0)
        except (OSError, http.client.HTTPException, ValueError) as e:
            stats.add(kind, "exception", time.time() - t0, f"{type(e).__name__}: {e}", expected=False)


def run_one(port, stats, kind, rnd, max_tokens, t0):
    n = rnd.randint(1, max_tokens)
    temp = rnd.choice([0, 0.7, 1.0])
    if kind in ("chat", "completion"):
        body = ({"messages": rnd.choice(CHAT_MESSAGES)} if kind == "chat" else {"prompt": rnd.choice(PROMPTS)})
        body.update({"max_tokens": n, "temperature": temp, "seed": rnd.randint(0, 1 << 30)})
        st, raw = request(port, "POST", "/v1/chat/completions" if kind == "chat" else "/v1/completions", body)
        problem = check_completion(kind, raw) if st == 200 else ""
        stats.add(kind, st, time.time() - t0, problem, expected=st == 200)
    elif kind in ("chat_stream", "completion_stream", "aborted_stream"):
        chat = kind == "chat_stream" or (kind == "aborted_stream" and rnd.random() < 0.5)
        body = {"messages": rnd.choice(CHAT_MESSAGES)} if chat else {"prompt": rnd.choice(PROMPTS)}
        body.update({"max_tokens": n if kind != "aborted_stream" else 200, "temperature": temp, "stream": True,
                     "ignore_eos": kind == "aborted_stream"})
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            c.request("POST", "/v1/chat/completions" if chat else "/v1/completions", body=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            problem = ""
            if r.status == 200:
                stop = rnd.randint(1, 5) if kind == "aborted_stream" else None
                problem, _ = read_stream(r, "chat" if chat else "completion", stop)
            else:
                r.read()
        finally:
            c.close()   # for aborted_stream: midway, the server must notice and cancel
        stats.add(kind, r.status, time.time() - t0, problem, expected=r.status == 200)
    elif kind == "tokenize":
        text = rnd.choice(PROMPTS) + " " + str(rnd.randint(0, 10**6))
        st, raw = request(port, "POST", "/tokenize", {"content": text})
        ok = st == 200 and isinstance(json.loads(raw).get("tokens"), list)
        stats.add(kind, st, time.time() - t0, "" if ok or st != 200 else "no tokens", expected=st == 200)
    elif kind == "detokenize":
        ids = [rnd.randint(0, 255) for _ in range(rnd.randint(1, 20))]
        st, raw = request(port, "POST", "/detokenize", {"tokens": ids})
        ok = st == 200 and isinstance(json.loads(raw).get("content"), str)
        stats.add(kind, st, time.time() - t0, "" if ok or st != 200 else "no content", expected=st == 200)
    else:
        body, path, want = rnd.choice(BAD)
        st, raw = request(port, "POST", path, body)
        problem = ""
        try:
            if not isinstance(json.loads(raw).get("error", {}).get("message"), str):
                problem = "error without a message"
        except ValueError:
            problem = "error body not JSON"
        stats.add(kind, st, time.time() - t0, problem, expected=st in want)


def greedy_answers(port):
    """The temperature-0 answers to the fixed prompts."""
    out = []
    for p in PROMPTS:
        st, raw = request(port, "POST", "/v1/completions", {"prompt": p, "max_tokens": 32, "temperature": 0})
        out.append(json.loads(raw)["choices"][0]["text"] if st == 200 else f"status {st}")
    for m in CHAT_MESSAGES:
        st, raw = request(port, "POST", "/v1/chat/completions", {"messages": m, "max_tokens": 32, "temperature": 0})
        out.append(json.loads(raw)["choices"][0]["message"]["content"] if st == 200 else f"status {st}")
    return out


def percentile(xs, q):
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "mlxcel"))
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "models", "kjv-moe"))
    ap.add_argument("--duration", type=float, default=600, help="seconds of load (default 600)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds before the warm RSS (default: a quarter of the run, at most 900)")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=2, help="server slots (default 2)")
    ap.add_argument("--ctx", type=int, default=512, help="context per slot (default 512)")
    ap.add_argument("--threads", type=int, default=0, help="server threads (default: its own)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--sample-every", type=float, default=5)
    ap.add_argument("--max-growth", type=float, default=1.0, help="allowed RSS growth after warm-up, percent")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log", help="the server's stderr goes here")
    ap.add_argument("--json", help="also write the report as JSON here")
    args = ap.parse_args()
    # slots' KV caches and the weights' pages become resident as they are
    # first used: a quarter of the run lets the load touch them
    warmup = args.warmup if args.warmup is not None else min(900.0, args.duration / 4)

    srv = Server(args)
    samples = [(0.0,) + srv.sample()]
    before = greedy_answers(srv.port)
    stats = Stats()
    t_start = time.time()
    deadline = t_start + args.duration
    workers = [threading.Thread(target=client, args=(srv.port, stats, deadline, args.seed * 1000 + i, args.max_tokens))
               for i in range(args.clients)]
    for w in workers:
        w.start()
    warm = None
    while any(w.is_alive() for w in workers):
        time.sleep(args.sample_every)
        now = time.time() - t_start
        s = (now,) + srv.sample()
        samples.append(s)
        if warm is None and now >= warmup:
            warm = s
        print(f"soak: {now:7.0f} s  rss {s[1] / 2**20:7.1f} MiB (anon {s[4] / 2**20:.1f})  threads {s[2]:3d}  fds {s[3]:3d}  "
              f"requests {sum(t['n'] for t in stats.by_type.values())}", file=sys.stderr, flush=True)
    for w in workers:
        w.join()
    after = greedy_answers(srv.port)
    end = (time.time() - t_start,) + srv.sample()
    samples.append(end)
    warm = warm or samples[min(1, len(samples) - 1)]
    exit_status = srv.stop()

    growth = 100.0 * (end[1] - warm[1]) / warm[1]
    anon_growth = 100.0 * (end[4] - warm[4]) / warm[4] if warm[4] else 0.0
    types = {}
    unexpected = malformed = 0
    for k, t in sorted(stats.by_type.items()):
        types[k] = {"requests": t["n"], "status": t["status"], "p50_ms": 1000 * percentile(t["lat"], 0.5),
                    "p99_ms": 1000 * percentile(t["lat"], 0.99), "malformed": len(t["malformed"]),
                    "unexpected_status": t["unexpected"], "problems": sorted(set(t["malformed"]))[:5]}
        unexpected += t["unexpected"]
        malformed += len(t["malformed"])
    report = {
        "model": args.model, "duration_s": args.duration, "clients": args.clients, "parallel": args.parallel,
        "requests": sum(t["requests"] for t in types.values()), "types": types,
        "rss_start_bytes": samples[0][1], "rss_warm_bytes": warm[1], "rss_end_bytes": end[1],
        "rss_max_bytes": max(s[1] for s in samples), "rss_growth_after_warmup_pct": growth,
        "anon_start_bytes": samples[0][4], "anon_warm_bytes": warm[4], "anon_end_bytes": end[4],
        "anon_growth_after_warmup_pct": anon_growth, "warmup_s": warm[0],
        "rss_series": [[round(x[0]), x[1], x[4]] for x in samples],
        "threads_start_end": [samples[0][2], end[2]], "fds_start_end": [samples[0][3], end[3]],
        "threads_max": max(s[2] for s in samples), "fds_max": max(s[3] for s in samples),
        "greedy_same": before == after, "unexpected_status": unexpected, "malformed": malformed,
        "sigterm_exit_status": exit_status,
    }
    if before != after:
        report["greedy_before"], report["greedy_after"] = before, after
    ok = (unexpected == 0 and malformed == 0 and before == after and growth < args.max_growth and
          exit_status == 0)
    report["clean"] = ok

    print(f"soak: {args.model}, {args.duration:.0f} s, {args.clients} clients, {args.parallel} slots: "
          f"{report['requests']} requests")
    print(f"| type | requests | status codes | p50 ms | p99 ms | malformed 200s |")
    print(f"| --- | --- | --- | --- | --- | --- |")
    for k, t in types.items():
        codes = ", ".join(f"{c}: {n}" for c, n in sorted(t["status"].items()))
        print(f"| {k} | {t['requests']} | {codes} | {t['p50_ms']:.0f} | {t['p99_ms']:.0f} | {t['malformed']} |")
    print(f"RSS: start {samples[0][1] / 2**20:.1f} MiB, after warm-up ({warm[0]:.0f} s) {warm[1] / 2**20:.1f} MiB, "
          f"end {end[1] / 2**20:.1f} MiB ({growth:+.2f} % after warm-up), max {report['rss_max_bytes'] / 2**20:.1f} MiB")
    print(f"anonymous RSS (heap, KV caches): start {samples[0][4] / 2**20:.1f} MiB, after warm-up {warm[4] / 2**20:.1f} MiB, "
          f"end {end[4] / 2**20:.1f} MiB ({anon_growth:+.2f} %)")
    print(f"threads start/end/max {samples[0][2]}/{end[2]}/{report['threads_max']}, "
          f"open fds start/end/max {samples[0][3]}/{end[3]}/{report['fds_max']}")
    print(f"temperature-0 answers before and after: {'same' if before == after else 'DIFFERENT'}; "
          f"unexpected statuses {unexpected}; malformed responses {malformed}; SIGTERM exit status {exit_status}")
    for k, t in types.items():
        for p in t["problems"]:
            print(f"  {k}: {p}")
    print("soak: " + ("clean" if ok else "NOT clean"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
