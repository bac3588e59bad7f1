#!/usr/bin/env bash
# Runs every test of omnibus. It first makes sure the servers the
# integration tests need are installed and running on loopback, as a
# fresh machine will not have them. What it may change on the machine:
#   - installs, as root with apt-get, the Debian packages kcat (librdkafka's
#     command-line client, for the Kafka interop test), rabbitmq-server and
#     nats-server, when their commands are missing;
#   - starts RabbitMQ (rabbitmq-server -detached, 127.0.0.1:5672) and NATS
#     with JetStream (127.0.0.1:4222, store /var/lib/nats-server, log
#     /var/log/nats-server.log) when nothing listens on their ports;
#   - enables RabbitMQ's rabbitmq_consistent_hash_exchange plugin (for the
#     partitioned mode), which the broker remembers in its enabled-plugins
#     file.
#   - checks that PostgreSQL (5432) and MariaDB (3306) answer, and says how
#     to start them when they do not (it does not install or start them).
# Nothing it cannot do stops it outside CI: the tests that need what is
# missing say so and are skipped (in CI, with CI set, they fail).
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

# PostgreSQL (127.0.0.1:5432, user postgres without a password, database
# test) and MariaDB (127.0.0.1:3306, root without a password, database
# test) for package sqlbus: checked, not installed or started; in CI a
# missing one fails.
db_missing=
if ! port_open 5432; then
  log "PostgreSQL does not answer on 127.0.0.1:5432; start it with: pg_ctlcluster 15 main start (Debian: apt-get install postgresql; trust local connections and createdb -U postgres test)"
  db_missing=1
fi
if ! port_open 3306; then
  log "MariaDB does not answer on 127.0.0.1:3306; start it with: service mariadb start (Debian: apt-get install mariadb-server; mysql -uroot -e 'CREATE DATABASE test')"
  db_missing=1
fi
if [ -n "$db_missing" ]; then
  if [ -n "${CI:-}" ]; then
    log "the sqlbus tests need PostgreSQL and MariaDB"
    exit 1
  fi
  log "the sqlbus tests of the missing databases will be skipped"
fi

exec go test -race -count=1 -timeout 20m "$@" ./...
