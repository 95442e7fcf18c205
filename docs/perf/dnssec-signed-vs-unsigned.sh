#!/bin/bash
# Signed against unsigned on one front end (one UDP thread): dnsperf with and without -D
# (docs/dns.md, "DNSSEC", "Cost"). DIR holds: serve.toml (grpc_listen and http_listen on port
# 0, data_dir, [demo] map_units = 20000, clusters = 20, seed = 1); dns.toml (listen on port 0,
# udp_threads = 1, metrics_listen on port 0, dnssec_keys = an ECDSAP256SHA256 KSK and ZSK from
# dnssec-keygen); names.txt (100,000 lines "n<i % 2000>.video.cdn.example A"); unique.txt
# (400,000 lines "u<i>.video.cdn.example A"). SECS sets each run's seconds (8).
set -u
B=$(realpath "${CDNMAP:-target/release/cdnmap}")
cd "${DIR:-/tmp/dnssec-bench}"  # holds serve.toml, dns.toml (dnssec_keys), names.txt, unique.txt
$B serve --config serve.toml > serve.log 2>&1 & SP=$!
for i in $(seq 1 60); do G=$(grep -o 'grpc=[0-9.:]*' serve.log | head -1 | cut -d= -f2); [ -n "$G" ] && break; sleep 1; done
rm -f dns.log; $B dns --config dns.toml --mapper http://$G > dns.log 2>&1 & DP=$!
sleep 1
for i in $(seq 1 60); do A=$(grep -o 'dns=[0-9.:]*' dns.log | head -1 | cut -d= -f2); [ -n "$A" ] && break; sleep 1; done
PORT=${A##*:}; echo "front end $A (port $PORT), mapper $G" 
for i in $(seq 1 60); do dig @127.0.0.1 -p $PORT www.cdn.example A +short | grep -q . && break; sleep 1; done
cpu() { awk '{print $14+$15}' /proc/$DP/stat; }
run() { # name, extra dnsperf args
  local what=$1; shift
  local before=$(cpu)
  local out=$(dnsperf -s 127.0.0.1 -p $PORT -l ${SECS:-8} -c 4 -q 200 "$@" 2>&1)
  local after=$(cpu)
  local done=$(echo "$out" | awk '/Queries completed/ {print $3}')
  local qps=$(echo "$out" | awk '/Queries per second/ {print $4}')
  local lost=$(echo "$out" | awk '/Queries lost/ {print $3}')
  local tck=$(getconf CLK_TCK)
  echo "$what qps=$qps completed=$done lost=$lost cpu_us_per_query=$(python3 -c "print(round(($after-$before)/$tck*1e6/max($done,1),2))")"
}
for r in 1 2 3; do
  run plain -d names.txt
  run do -d names.txt -D
done
run do_unique_names -d unique.txt -D
M=$(grep -o "metrics=[0-9.:]*" dns.log | head -1 | cut -d= -f2); curl -s http://$M/metrics | grep "^cdnmap_dns_dnssec_signatures_total"
kill $DP $SP; wait 2>/dev/null
