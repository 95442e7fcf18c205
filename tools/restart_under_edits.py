#!/usr/bin/env python3
"""Restart time of `cdnmap serve` under continuous Admin edits (issue 41, finding 9).

Starts the mapper on the demo world, drives dashboard actions (each an Admin edit through
the topology writer, journaled) without pause from a thread, and every few seconds kills it
with SIGKILL and starts it again on the same store, timing each start until the stored map
is served (`/api/status` answers 200 with a map). Prints each restart's time, the median and
the maximum.

usage: tools/restart_under_edits.py BINARY WORKDIR RESTARTS [SEED] (docs/perf/topology-edits.md)
"""
import json, os, random, signal, statistics, subprocess, sys, threading, time, urllib.request

binary, work, restarts = sys.argv[1], sys.argv[2], int(sys.argv[3])
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 1
rng = random.Random(seed)
os.makedirs(work, exist_ok=True)
http = "127.0.0.1:%d" % (18400 + seed)
config = os.path.join(work, "c.toml")
with open(config, "w") as f:
    f.write(f'''cycle_secs = 10
grpc_listen = "127.0.0.1:0"
http_listen = "{http}"
data_dir = "{work}/data"
admin_token = "benchtoken-41"
''')

def get(path, timeout=2):
    with urllib.request.urlopen(f"http://{http}{path}", timeout=timeout) as r:
        return r.status, r.read()

def post_state(cluster, state):
    req = urllib.request.Request(f"http://{http}/api/clusters/{cluster}/state",
        data=json.dumps({"state": state, "reason": "bench"}).encode(), method="POST",
        headers={"Authorization": "Bearer benchtoken-41", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status

def start():
    log = open(os.path.join(work, "log"), "ab")
    p = subprocess.Popen([binary, "serve", "--config", config], stdout=log, stderr=log)
    t0 = time.monotonic()
    while True:
        if p.poll() is not None:
            sys.exit(f"cdnmap serve exited {p.returncode}")
        try:
            status, body = get("/api/status", timeout=1)
            if status == 200 and json.loads(body).get("map_version"):
                return p, time.monotonic() - t0
        except Exception:
            pass
        if time.monotonic() - t0 > 120:
            sys.exit("no map served within 120 s")
        time.sleep(0.02)

stop = threading.Event()
edits = [0]
def edit_loop(clusters):
    while not stop.is_set():
        try:
            post_state(rng.choice(clusters), rng.choice(["drained", "up"]))
            edits[0] += 1
        except Exception:
            time.sleep(0.05)

p, first = start()
_, body = get("/api/clusters")
clusters = [c["id"] for c in json.loads(body)["clusters"]]
times = []
for i in range(restarts):
    stop.clear()
    t = threading.Thread(target=edit_loop, args=(clusters,), daemon=True)
    t.start()
    time.sleep(rng.uniform(10, 25))
    p.send_signal(signal.SIGKILL)
    p.wait()
    stop.set()
    t.join()
    p, took = start()
    times.append(took)
    print(f"restart {i + 1}: {took:.2f} s (edits so far {edits[0]})", flush=True)
p.send_signal(signal.SIGTERM)
p.wait()
print(f"restarts {len(times)}: median {statistics.median(times):.2f} s, max {max(times):.2f} s, "
      f"edits {edits[0]}")
