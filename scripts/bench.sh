#!/usr/bin/env bash
# bench.sh: omnibus against each transport's raw client, sides alternated,
# and a table of omnibus/raw ratios against the speed targets.
#
# Usage: scripts/bench.sh [-r ROUNDS] [-s SCALE] [-p PKGS] [-o DIR]
#        scripts/bench.sh -t DIR
#
#   -r ROUNDS  rounds (default 5)
#   -s SCALE   multiplies every message count and latency duration
#              (default 1; 0.1 for a quick check that everything runs)
#   -p PKGS    only these packages, comma-separated (default
#              kafkabus,natsbus,rabbitbus,redisbus,nsqbus,kinesisbus,
#              membus,omnibus; omnibus is the root package)
#   -o DIR     keep the outputs in DIR (default: a new temporary directory)
#   -t DIR     print the table of DIR's outputs again, running nothing
#
# The servers: NATS on 127.0.0.1:4222 (NATS_URL), RabbitMQ on
# 127.0.0.1:5672 (RABBITBUS_URL), Redis on 127.0.0.1:6379 and kinesalite
# on 127.0.0.1:4567, as for the tests (scripts/test.sh starts them); Kafka
# is kfake, in-process, and nsqd the nsq module's, started by the
# benchmark. Each side removes the streams, exchanges and queues it
# creates.
#
# Each comparison is a pair of sub-benchmarks, omnibus/<size> and
# raw/<size>. go test -count N would run each sub-benchmark N times in a
# row, so the test binaries are built once and run once per round
# instead, omnibus first in odd rounds and raw first in even ones
# (OMNIBUS_BENCH_RAW_FIRST), so that neither side always runs on the
# warmer (or the more loaded) machine. A ratio is the median over the
# rounds of the round's omnibus/raw; a latency difference the median of
# the round's omnibus p99 - raw p99. The side columns are the medians of
# each side's values. The redisbus and nsqbus throughput benchmarks
# alternate their sides within one benchmark (parts of b.N) and report
# both, as omnibus-msgs/s and raw-msgs/s: the table reads them as the
# two sides.
#
# With the default counts a round takes about 6 minutes on 2 cores with
# nothing else running: 3.2 for kafkabus, natsbus, rabbitbus, membus and
# omnibus (956 s for 5 rounds), 2.5 for redisbus, nsqbus and kinesisbus;
# 5 rounds of everything take about half an hour. benchstat's summary of
# every benchmark goes to DIR/benchstat.txt when
# golang.org/x/perf/cmd/benchstat can be run.
set -euo pipefail

cd "$(dirname "$0")/.."
rounds=5 scale=1 pkgs=kafkabus,natsbus,rabbitbus,redisbus,nsqbus,kinesisbus,membus,omnibus out= table=
while getopts r:s:p:o:t:h opt; do
	case $opt in
	r) rounds=$OPTARG ;;
	s) scale=$OPTARG ;;
	p) pkgs=$OPTARG ;;
	o) out=$OPTARG ;;
	t) table=$OPTARG ;;
	*) sed -n '2,20s/^# \{0,1\}//p' "$0"; exit 2 ;;
	esac
done

# jobs: package, benchmark regexp, message count (x) or duration (s).
# Kafka's publish and consume counts are 200,000: at 50,000 a side on
# kfake ran for under 0.1 s, and its start (joining the group, the
# producer's first metadata) decided the ratio.
jobs='
kafkabus   ^BenchmarkPublishAsync$        200000x
kafkabus   ^BenchmarkPublishConcurrent$   5000x
kafkabus   ^BenchmarkConsume$             200000x
kafkabus   ^BenchmarkLatency$             3s
natsbus    ^BenchmarkPublishAsync$        20000x
natsbus    ^BenchmarkPublishConcurrent$   5000x
natsbus    ^BenchmarkConsume$             100000x
natsbus    ^BenchmarkLatency$             3s
rabbitbus  ^BenchmarkPublishAsync$        10000x
rabbitbus  ^BenchmarkPublishConcurrent$   2000x
rabbitbus  ^BenchmarkConsume$             30000x
rabbitbus  ^BenchmarkLatency$             3s
redisbus   ^BenchmarkPublish$             100000x
redisbus   ^BenchmarkConsume$             100000x
redisbus   ^BenchmarkLatency$             3s
nsqbus     ^BenchmarkPublish$             200000x
nsqbus     ^BenchmarkConsume$             100000x
nsqbus     ^BenchmarkLatency$             3s
kinesisbus ^BenchmarkLatency$             3s
membus     ^BenchmarkLatency$             3s
omnibus    ^BenchmarkNoopHandler$/^mode=key$  200000x
'

# targets: label, package, benchmark, side, raw side (- for none), size,
# unit, kind, target. ratio: median omnibus/raw at least target; cpuratio:
# median raw/omnibus of the processor time per message at least target
# (where client and server share the process, kfake: the rate's target
# read from the steadier measure); diff: median omnibus-raw at most
# target; max: median omnibus at most target.
targets='
async-publish          kafkabus  PublishAsync       omnibus        raw  100B  msgs/s     ratio  0.9
async-publish          kafkabus  PublishAsync       omnibus        raw  1KiB  msgs/s     ratio  0.9
async-publish          kafkabus  PublishAsync       omnibus        raw  100B  cpu-ns/msg cpuratio 0.9
async-publish          kafkabus  PublishAsync       omnibus        raw  1KiB  cpu-ns/msg cpuratio 0.9
async-publish          natsbus   PublishAsync       omnibus        raw  100B  msgs/s     ratio  0.9
async-publish          natsbus   PublishAsync       omnibus        raw  1KiB  msgs/s     ratio  0.9
async-publish          rabbitbus PublishAsync       omnibus        raw  100B  msgs/s     ratio  0.9
async-publish          rabbitbus PublishAsync       omnibus        raw  1KiB  msgs/s     ratio  0.9
publish-16-goroutines  kafkabus  PublishConcurrent  omnibus        raw  100B  msgs/s     ratio  0.5
publish-16-goroutines  natsbus   PublishConcurrent  omnibus        raw  100B  msgs/s     ratio  0.5
publish-16-goroutines  rabbitbus PublishConcurrent  omnibus        raw  100B  msgs/s     ratio  0.5
consume-key-noop       kafkabus  Consume            omnibus        raw  100B  msgs/s     ratio  0.7
consume-batch-noop     kafkabus  Consume            omnibus-batch  raw  100B  msgs/s     ratio  0.9
consume-key-noop       kafkabus  Consume            omnibus        raw  100B  cpu-ns/msg cpuratio 0.7
consume-batch-noop     kafkabus  Consume            omnibus-batch  raw  100B  cpu-ns/msg cpuratio 0.9
consume-noop           natsbus   Consume            omnibus        raw  100B  msgs/s     ratio  0.95
consume-noop           natsbus   Consume            omnibus        raw  1KiB  msgs/s     ratio  0.95
consume-noop           rabbitbus Consume            omnibus        raw  100B  msgs/s     ratio  0.95
consume-noop           rabbitbus Consume            omnibus        raw  1KiB  msgs/s     ratio  0.95
p99-latency-1k/s       kafkabus  Latency            omnibus        raw  100B  p99-ms     diff   1
p99-latency-1k/s       natsbus   Latency            omnibus        raw  100B  p99-ms     diff   1
p99-latency-1k/s       rabbitbus Latency            omnibus        raw  100B  p99-ms     diff   1
p99-latency-1k/s       redisbus  Latency            omnibus        raw  100B  p99-ms     diff   1
p99-latency-1k/s       nsqbus    Latency            omnibus        raw  100B  p99-ms     diff   1
p99-latency-1k/s       kinesisbus Latency           omnibus        raw  100B  p99-ms     diff   1
p99-latency-1k/s       membus    Latency            omnibus        -    100B  p99-ms     max    1
publish                redisbus  Publish            omnibus        raw  100B  msgs/s     ratio  0.9
publish                redisbus  Publish            omnibus        raw  1024B msgs/s     ratio  0.9
consume-noop           redisbus  Consume            omnibus        raw  100B  msgs/s     ratio  0.9
consume-noop           redisbus  Consume            omnibus        raw  1024B msgs/s     ratio  0.9
publish-json           nsqbus    Publish            omnibus        raw  100B  msgs/s     ratio  0.9
publish-json           nsqbus    Publish            omnibus        raw  1024B msgs/s     ratio  0.9
publish-binary         nsqbus    Publish            omnibus        raw  binary-100B msgs/s ratio 0.9
publish-binary         nsqbus    Publish            omnibus        raw  binary-1024B msgs/s ratio 0.9
consume-noop-json      nsqbus    Consume            omnibus        raw  100B  msgs/s     ratio  0.9
consume-noop-json      nsqbus    Consume            omnibus        raw  1024B msgs/s     ratio  0.9
engine-allocs-per-msg  omnibus   NoopHandler        mode=key       -    -     allocs/op  max    3
'

# print_table reads the normalized results (package round benchmark side
# size unit value) and prints the targets' rows.
print_table() {
	awk -v targets="$targets" '
	function median(a, n,    i, j, t) {
		for (i = 2; i <= n; i++)
			for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
		return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
	}
	function side(p, bench, s, size, unit,    r, n, a) {
		n = 0
		for (r = 1; r <= maxr; r++)
			if ((p, r, bench, s, size, unit) in v) a[++n] = v[p, r, bench, s, size, unit]
		return n ? median(a, n) : ""
	}
	{ v[$1, $2, $3, $4, $5, $6] = $7; if ($2 > maxr) maxr = $2 }
	END {
		printf "%-22s %-10s %-12s %-14s %12s %12s %9s %9s  %s\n", "target", "transport", "size", "omnibus side", "omnibus", "raw", "result", "target", ""
		nt = split(targets, lines, "\n")
		for (l = 1; l <= nt; l++) {
			if (split(lines[l], f, " ") < 9) continue
			label = f[1]; p = f[2]; bench = f[3]; s = f[4]; rs = f[5]; size = f[6]; unit = f[7]; kind = f[8]; target = f[9]
			o = side(p, bench, s, size, unit)
			r = rs == "-" ? "" : side(p, bench, rs, size, unit)
			n = 0; delete a
			for (rr = 1; rr <= maxr; rr++) {
				if (!((p, rr, bench, s, size, unit) in v)) continue
				ov = v[p, rr, bench, s, size, unit]
				if (kind == "max") { a[++n] = ov; continue }
				if (!((p, rr, bench, rs, size, unit) in v)) continue
				rv = v[p, rr, bench, rs, size, unit]
				if (kind == "ratio" && rv > 0) a[++n] = ov / rv
				if (kind == "cpuratio" && ov > 0) a[++n] = rv / ov
				if (kind == "diff") a[++n] = ov - rv
			}
			tg = kind == "diff" ? "<= +" target : kind == "max" ? "<= " target : ">= " target "x"
			if (n == 0) { res = "-"; verdict = "NO DATA" }
			else {
				m = median(a, n)
				if (kind == "ratio" || kind == "cpuratio") { res = sprintf("%.2fx", m); ok = m >= target }
				if (kind == "diff") { res = sprintf("%+.2f", m); ok = m <= target }
				if (kind == "max") { res = sprintf("%.2f", m); ok = m <= target }
				verdict = ok ? "ok" : "MISSED"
			}
			printf "%-22s %-10s %-12s %-14s %12s %12s %9s %9s  %s (%d rounds, %s)\n", label, p, size, s, fmtv(o), fmtv(r), res, tg, verdict, n, unit
		}
	}
	function fmtv(x) { return x == "" ? "-" : (x >= 100 ? sprintf("%.0f", x) : sprintf("%.2f", x)) }
	' "$1"
}

if [ -n "$table" ]; then
	print_table "$table/results.txt"
	exit
fi

out=${out:-$(mktemp -d /tmp/omnibus-bench.XXXXXX)}
mkdir -p "$out/bin"
: >"$out/results.txt"
start=$(date +%s)

dir_of() { [ "$1" = omnibus ] && echo . || echo "./$1"; }

# Build each package's test binary once.
for p in ${pkgs//,/ }; do
	echo "building $p" >&2
	go test -c -o "$out/bin/$p.test" "$(dir_of "$p")"
done

# scaled N: a count or a duration times scale.
scaled() {
	awk -v b="$1" -v s="$scale" 'BEGIN {
		u = substr(b, length(b)); n = substr(b, 1, length(b) - 1) * s
		if (u == "x") printf "%dx", (n < 1 ? 1 : n); else printf "%gs", n
	}'
}

for round in $(seq 1 "$rounds"); do
	rawfirst= order="omnibus first"
	if [ $((round % 2)) -eq 0 ]; then rawfirst=1 order="raw first"; fi
	echo "round $round of $rounds ($order), $(($(date +%s) - start))s so far" >&2
	echo "$jobs" | while read -r p bench n; do
		[ -n "$p" ] || continue
		case ",$pkgs," in *",$p,"*) ;; *) continue ;; esac
		log="$out/$p.$(echo "$bench" | tr -cd 'A-Za-z').r$round.txt"
		# Each benchmark runs twice in its process and the second run
		# counts (the table keeps a side's last value): the first pays for
		# the process's start (a heap grown from nothing, first
		# connections and metadata), which halved the rate of whichever
		# side ran first on kfake.
		(cd "$(dir_of "$p")" && OMNIBUS_BENCH_RAW_FIRST=$rawfirst "$out/bin/$p.test" \
			-test.run '^$' -test.bench "$bench" -test.benchtime "$(scaled "$n")" -test.count 2 -test.timeout 10m) >"$log" 2>&1 ||
			echo "  $p $bench failed: see $log" >&2
		# Normalize: package round benchmark side size unit value.
		# A benchmark named <name>/<size> that reports both sides
		# (omnibus-<unit> and raw-<unit>) gives one line per side.
		awk -v p="$p" -v r="$round" '/^Benchmark/ {
			name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
			k = split(name, part, "/"); size = k >= 3 ? part[3] : "-"
			for (i = 3; i < NF; i += 2) {
				unit = $(i+1)
				if (k == 2 && match(unit, /^(omnibus|raw)-/)) {
					print p, r, part[1], substr(unit, 1, RLENGTH - 1), part[2], substr(unit, RLENGTH + 1), $i
					continue
				}
				print p, r, part[1], part[2], size, unit, $i
			}
		}' "$log" >>"$out/results.txt"
	done
done

echo "outputs in $out; $(($(date +%s) - start))s" >&2
echo
print_table "$out/results.txt"

if go run golang.org/x/perf/cmd/benchstat@latest -h >/dev/null 2>&1; then
	for p in ${pkgs//,/ }; do
		echo "== $p"
		cat "$out/$p".*.txt | grep -v -e '^PASS' -e '^ok' | go run golang.org/x/perf/cmd/benchstat@latest /dev/stdin || true
	done >"$out/benchstat.txt" 2>&1
	echo "benchstat summary: $out/benchstat.txt" >&2
fi
