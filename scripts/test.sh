#!/usr/bin/env bash
# Runs every test of omnibus. It first makes sure the servers the
# integration tests need are installed and running on loopback, as a
# fresh machine will not have them. What it may change on the machine:
#   - installs, as root with apt-get, the Debian packages kcat (librdkafka's
#     command-line client, for the Kafka interop test), rabbitmq-server,
#     nats-server, redis-server, postgresql, mariadb-server, nodejs, npm
#     and chromium (the console's browser test), when their commands are
#     missing, and the npm packages
#     kinesalite and dynalite into ~/.cache/omnibus-npm;
#   - starts, when nothing listens on their ports, all on 127.0.0.1:
#     RabbitMQ (rabbitmq-server -detached, 5672), NATS with JetStream
#     (4222, store /var/lib/nats-server, log /var/log/nats-server.log),
#     Redis (6379, nothing kept on disk), PostgreSQL (5432), MariaDB
#     (3306), kinesalite (4567) and dynalite (4568);
#   - for a PostgreSQL or MariaDB it starts: trusts local TCP connections
#     to PostgreSQL (pg_hba.conf), gives MariaDB's root@localhost an empty
#     password, and creates the databases named test;
#   - enables RabbitMQ's rabbitmq_consistent_hash_exchange plugin (for the
#     partitioned mode), which the broker remembers in its enabled-plugins
#     file.
# Nothing it cannot do stops it outside CI: the tests that need what is
# missing say so and are skipped (in CI, with CI set, they fail).
# Kafka itself runs in-process (kfake); the embedded NATS server needs
# nothing installed, nor do nsqd and nsqlookupd, which the NSQ tests run
# from the nsq module's packages (internal/nsqtest). After the tests,
# every fuzz target runs briefly (see FUZZTIME below).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'scripts/test.sh: %s\n' "$*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # port seconds
  for _ in $(seq 1 "$2"); do port_open "$1" && return 0; sleep 1; done
  return 1
}

apt_updated=
need_pkg() { # command package
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" != 0 ]; then log "$2 is missing and this is not root: install it (apt-get install $2)"; return 0; fi
  if [ -z "$apt_updated" ]; then DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || true; apt_updated=1; fi
  log "installing $2"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null || log "could not install $2"
}

need_pkg kcat kcat
# Headless Chromium for the console's browser test (package console).
need_pkg chromium chromium

if ! port_open 5672; then
  need_pkg rabbitmq-server rabbitmq-server
  log "starting RabbitMQ"
  rabbitmq-server -detached >/dev/null 2>&1 || true
  wait_port 5672 90 || log "RabbitMQ did not come up on 5672"
fi
if command -v rabbitmq-plugins >/dev/null 2>&1 && port_open 5672; then
  if ! rabbitmq-plugins list -e -m 2>/dev/null | grep -qx rabbitmq_consistent_hash_exchange; then
    log "enabling rabbitmq_consistent_hash_exchange"
    if ! rabbitmq-plugins enable rabbitmq_consistent_hash_exchange >/dev/null 2>&1; then
      if [ -n "${CI:-}" ]; then
        log "could not enable rabbitmq_consistent_hash_exchange; the partitioned RabbitMQ tests need it"
        exit 1
      fi
      log "could not enable rabbitmq_consistent_hash_exchange (try as root: rabbitmq-plugins enable rabbitmq_consistent_hash_exchange); the partitioned RabbitMQ tests will be skipped"
    fi
  fi
fi

if ! port_open 4222; then
  need_pkg nats-server nats-server
  log "starting NATS with JetStream"
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec "$(command -v nats-server)" -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_port 4222 30 || log "NATS did not come up on 4222"
fi

# Kinesis and DynamoDB for kinesisbus: kinesalite and dynalite from npm, run
# by node, in memory, on 127.0.0.1:4567 and 127.0.0.1:4568 (they would
# listen on every interface by themselves). Installs nodejs and npm with
# apt-get when missing, and the two packages into $OMNIBUS_NPM_DIR
# (default ~/.cache/omnibus-npm).
npm_dir=${OMNIBUS_NPM_DIR:-$HOME/.cache/omnibus-npm}
# A client that drops a connection mid-request (a cancelled context) makes
# dynalite throw from a request's error event and exit: log and go on.
survive="process.on('uncaughtException', e => console.error('ignored:', e && e.stack || e));"
if ! port_open 4567 || ! port_open 4568; then
  need_pkg node nodejs
  need_pkg npm npm
  if command -v npm >/dev/null 2>&1 && [ ! -d "$npm_dir/node_modules/kinesalite" -o ! -d "$npm_dir/node_modules/dynalite" ]; then
    log "installing kinesalite and dynalite into $npm_dir"
    mkdir -p "$npm_dir"
    (cd "$npm_dir" && npm install --silent --no-audit --no-fund kinesalite@3 dynalite@4 >/dev/null 2>&1) || log "could not install kinesalite and dynalite"
  fi
fi
if ! port_open 4567 && [ -d "$npm_dir/node_modules/kinesalite" ]; then
  log "starting kinesalite on 127.0.0.1:4567"
  nohup node -e "$survive require('$npm_dir/node_modules/kinesalite')({createStreamMs: 20, deleteStreamMs: 20, updateStreamMs: 20, shardLimit: 100000}).listen(4567, '127.0.0.1')" \
    >/var/log/kinesalite.log 2>&1 &
  wait_port 4567 30 || log "kinesalite did not come up on 4567"
fi
if ! port_open 4568 && [ -d "$npm_dir/node_modules/dynalite" ]; then
  log "starting dynalite on 127.0.0.1:4568"
  nohup node -e "$survive require('$npm_dir/node_modules/dynalite')({createTableMs: 20, deleteTableMs: 20, updateTableMs: 20}).listen(4568, '127.0.0.1')" \
    >/var/log/dynalite.log 2>&1 &
  wait_port 4568 30 || log "dynalite did not come up on 4568"
fi
if ! port_open 6379; then
  need_pkg redis-server redis-server
  log "starting Redis"
  if command -v redis-server >/dev/null 2>&1; then
    redis-server --bind 127.0.0.1 --port 6379 --save "" --appendonly no --daemonize yes >/dev/null || true
    wait_port 6379 30 || log "Redis did not come up on 6379"
  fi
fi
# redisbus's restart and bad-input tests start redis-server processes of
# their own: the binary must be there even when a Redis already listens.
need_pkg redis-server redis-server

# PostgreSQL (127.0.0.1:5432, user postgres without a password, database
# test) and MariaDB (127.0.0.1:3306, root without a password, database
# test) for package sqlbus. When nothing listens there and this is root:
# installs postgresql and mariadb-server with apt-get when missing, starts
# them, lets local TCP connections to PostgreSQL in without a password
# (trust, in the cluster's pg_hba.conf), gives MariaDB's root@localhost an
# empty password, and creates the databases named test. A machine whose
# servers already answer is left as it is.
start_postgres() {
  need_pkg pg_ctlcluster postgresql
  command -v pg_lsclusters >/dev/null 2>&1 || return 0
  local ver
  ver=$(pg_lsclusters -h 2>/dev/null | awk 'NR == 1 { print $1 }')
  [ -n "$ver" ] || return 0
  local hba=/etc/postgresql/$ver/main/pg_hba.conf
  if [ -f "$hba" ] && ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
    log "letting local TCP connections into PostgreSQL without a password ($hba)"
    sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
  fi
  log "starting PostgreSQL $ver"
  pg_ctlcluster "$ver" main start >/dev/null 2>&1 || pg_ctlcluster "$ver" main reload >/dev/null 2>&1 || true
  wait_port 5432 30 || { log "PostgreSQL did not come up on 5432"; return 0; }
  su postgres -c "psql -qtAc \"SELECT 1 FROM pg_database WHERE datname = 'test'\"" 2>/dev/null | grep -q 1 ||
    su postgres -c "createdb test" >/dev/null 2>&1 || log "could not create PostgreSQL database test"
}
start_mariadb() {
  need_pkg mariadbd mariadb-server
  command -v mariadbd >/dev/null 2>&1 || return 0
  log "starting MariaDB"
  service mariadb start >/dev/null 2>&1 || service mysql start >/dev/null 2>&1 || true
  wait_port 3306 30 || { log "MariaDB did not come up on 3306"; return 0; }
  mariadb -uroot -e "ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD(''); CREATE DATABASE IF NOT EXISTS test" >/dev/null 2>&1 ||
    log "could not give MariaDB's root an empty password and create database test"
}
if [ "$(id -u)" = 0 ]; then
  port_open 5432 || start_postgres
  port_open 3306 || start_mariadb
fi
db_missing=
if ! port_open 5432; then
  log "PostgreSQL does not answer on 127.0.0.1:5432 (as root this script installs and starts it)"
  db_missing=1
fi
if ! port_open 3306; then
  log "MariaDB does not answer on 127.0.0.1:3306 (as root this script installs and starts it)"
  db_missing=1
fi
if [ -n "$db_missing" ]; then
  if [ -n "${CI:-}" ]; then
    log "the sqlbus tests need PostgreSQL and MariaDB"
    exit 1
  fi
  log "the sqlbus tests of the missing databases will be skipped"
fi

status=0
go test -race -count=1 -timeout 20m "$@" ./... || status=$?

# Fuzzing: every fuzz target (found with go test -list) runs for FUZZTIME
# (default 3s; 0 skips them) from its seed corpus (f.Add, and the files in
# the package's testdata/fuzz). go test -fuzz takes one package and one
# target at a time; a failing run shows the end of its output. A failing
# input is written to testdata/fuzz: commit it with the fix, so the plain
# test run checks it from then on. Inputs are not minimized: minimizing
# each new interesting input took the whole run here (FuzzDecodeStructured:
# 58 of 60 s at 0 execs/s), and Go's fuzzer can fail spuriously while it
# minimizes ("hung or terminated unexpectedly while minimizing", Go
# issues 48820, 52569 and 56238), as a CI run of this target did.
# Go 1.26's fuzzing coordinator can also fail a run at the end of its
# -fuzztime with "context deadline exceeded" and no failing input (Go
# issue 75804, fixed in Go 1.27), as a CI run of FuzzParseTime did: such
# a run, with no new file in testdata/fuzz, is said and not counted.
fuzztime=${FUZZTIME:-3s}
if [ "$fuzztime" != 0 ]; then
  while read -r pkg target; do
    log "fuzzing $pkg $target for $fuzztime"
    fuzzlog=$(mktemp)
    corpus="$(go list -f '{{.Dir}}' "$pkg")/testdata/fuzz/$target"
    before=$( { ls "$corpus" 2>/dev/null || true; } | wc -l)
    go test -run '^$' -fuzz "^$target\$" -fuzztime "$fuzztime" -fuzzminimizetime 0 "$pkg" >"$fuzzlog" 2>&1 || {
      after=$( { ls "$corpus" 2>/dev/null || true; } | wc -l)
      if [ "$before" = "$after" ] && grep -qx '    context deadline exceeded' "$fuzzlog"; then
        log "fuzz target $target of $pkg: Go's coordinator failed on its own deadline (Go issue 75804), no failing input; not counted"
      else
        log "fuzz target $target of $pkg failed:"
        tail -n 40 "$fuzzlog"
        go test -run "^$target\$" "$pkg" || true
        status=1
      fi
    }
    rm -f "$fuzzlog"
  done < <(go test -list '^Fuzz' ./... | awk '/^Fuzz/ { t[n++] = $1; next } /^ok/ { for (i = 0; i < n; i++) print $2, t[i]; n = 0 }')
fi
exit "$status"
