"""Whose address comes first through a resolver (docs/perf/answers-through-resolvers.md).

Usage: python3 first-address.py HTTP_ADDR DNS_ADDR UNBOUND_PORT N
  HTTP_ADDR     the mapper's HTTP listener (host:port), for /api/lookup
  DNS_ADDR      cdnmap dns (host:port), asked directly
  UNBOUND_PORT  unbound on 127.0.0.1, with cdn.example a stub zone at DNS_ADDR and ECS on
  N             how many mapped web units to ask for (u00000001-web, ...)
Counts the answers through unbound whose first address is not one of the unit's cluster (the
first two of the direct answer: every demo cluster has two IPv4 servers).
"""
import json, subprocess, sys, urllib.request
H, D, U, N = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def dig(port, subnet, name="www.cdn.example"):
    out = subprocess.run(["dig", "+short", "+tries=1", "+time=2", "-p", port, "@127.0.0.1", name, "A",
                          f"+subnet={subnet}"], capture_output=True, text=True).stdout
    return [l for l in out.split() if l[0].isdigit()]
subnets = []
i = 1
while len(subnets) < N and i < 5 * N:
    uid = f"u{i:08d}-web"
    i += 1
    try:
        d = json.load(urllib.request.urlopen(f"http://{H}/api/lookup?q={uid}"))
    except Exception:
        continue
    u = d["units"][0]
    if u["route"] != "mapped":
        continue
    subnets.append(u["prefixes"][0])
first_second, total, direct_three = 0, 0, 0
for s in subnets:
    direct = dig(D.split(":")[1], s)
    via = dig(U, s)
    if len(direct) < 2 or not via:
        continue
    direct_three += 1
    total += 1
    if via[0] not in direct[:2]:
        first_second += 1
print(f"{total} mapped units through unbound: first address not the unit's cluster in {first_second} ({100*first_second/max(total,1):.1f}%)")
