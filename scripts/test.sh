#!/usr/bin/env bash
# Runs every test of omnibus. It first makes sure the servers the
# integration tests need are installed and running on loopback, as a
# fresh machine will not have them. What it may change on the machine:
#   - installs, as root with apt-get, the Debian packages kcat (librdkafka's
#     command-line client, for the Kafka interop test), rabbitmq-server,
#     nats-server and redis-server, when their commands are missing;
#   - starts RabbitMQ (rabbitmq-server -detached, 127.0.0.1:5672), NATS
#     with JetStream (127.0.0.1:4222, store /var/lib/nats-server, log
#     /var/log/nats-server.log) and Redis (127.0.0.1:6379, nothing kept on
#     disk) when nothing listens on their ports;
#   - enables RabbitMQ's rabbitmq_consistent_hash_exchange plugin (for the
#     partitioned mode), which the broker remembers in its enabled-plugins
#     file.
# Nothing it cannot do stops it outside CI: the tests that need what is
# missing say so and are skipped (in CI, with CI set, they fail).
#   - installs nodejs and npm (apt-get) and kinesalite and dynalite (npm,
#     into ~/.cache/omnibus-npm) and starts them on 127.0.0.1:4567 and 4568.
# Kafka itself runs in-process (kfake); the embedded NATS server needs
# nothing installed.
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

exec go test -race -count=1 -timeout 20m "$@" ./...
