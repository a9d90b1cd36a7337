#!/usr/bin/env bash
# Make sure the services the test suite talks to are up. The core engine's
# tests need none (SQLite is embedded, receivers are in-process); backends and
# brokers added later start theirs here, each only when it is not running.
set -euo pipefail

# --- RabbitMQ: tests/integration/amqp and tests/e2e/test_amqp_hookdeck.py -------------
# The broker on 127.0.0.1:5672 (guest/guest). Started only when the port is closed;
# installed with apt only when the binary is missing. Bounded: 60 s to come up.
rabbitmq_listening() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }

ensure_rabbitmq() {
  export PATH="$PATH:/usr/sbin"
  if rabbitmq_listening; then
    echo "test services: rabbitmq already running on 127.0.0.1:5672"
    return 0
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if ! command -v rabbitmq-server >/dev/null 2>&1; then
    echo "test services: rabbitmq-server is missing; installing it with apt"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q rabbitmq-server >/dev/null \
      || { $sudo apt-get update -q >/dev/null \
           && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q rabbitmq-server >/dev/null; }
    if [ ! -e /etc/rabbitmq/rabbitmq.conf ]; then
      # A fresh install listens on every interface; tests only ever need loopback.
      echo "listeners.tcp.local = 127.0.0.1:5672" | $sudo tee /etc/rabbitmq/rabbitmq.conf >/dev/null
    fi
  fi
  if ! rabbitmq_listening; then
    echo "test services: starting rabbitmq-server"
    # The Debian wrapper switches to the rabbitmq user when run as root.
    $sudo rabbitmq-server -detached
  fi
  local deadline=$((SECONDS + 60))
  until rabbitmq_listening && timeout 15 $sudo rabbitmqctl -q await_startup >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      echo "test services: rabbitmq did not come up within 60 s" >&2
      return 1
    fi
    sleep 0.5
  done
  echo "test services: rabbitmq running on 127.0.0.1:5672"
}

ensure_rabbitmq

# --- PostgreSQL: the backend-parametrised tests ------------------------------------------
# Uses the machine's server at 127.0.0.1:5432 (trust auth, database `test`) when it
# answers; starts it when it is installed but down; otherwise makes a throwaway
# cluster (initdb, trust, 127.0.0.1:55432) under /tmp. The DSN the tests use is written
# to .test-services/postgres.dsn (tests/support/databases.py reads it).
PY=${PYTHON_BIN:-.venv/bin/python}
pg_answers() {
  "$PY" - "$1" <<'PYCODE' >/dev/null 2>&1
import asyncio, sys
import asyncpg
async def main() -> None:
    conn = await asyncio.wait_for(asyncpg.connect(sys.argv[1]), 5)
    await conn.close()
asyncio.run(main())
PYCODE
}

ensure_postgres() {
  mkdir -p .test-services
  local dsn="postgresql://postgres@127.0.0.1:5432/test"
  if ! pg_answers "$dsn" && [ -d /etc/postgresql ] && command -v pg_ctlcluster >/dev/null; then
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    echo "test services: starting PostgreSQL $version"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    local deadline=$((SECONDS + 30))
    until pg_answers "$dsn" || ((SECONDS >= deadline)); do sleep 0.5; done
  fi
  if ! pg_answers "$dsn"; then
    dsn="postgresql://postgres@127.0.0.1:55432/test"
    if ! pg_answers "$dsn"; then
      local bindir
      bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
      if [ -z "$bindir" ] && [ "$(id -u)" -eq 0 ]; then
        echo "test services: installing PostgreSQL with apt"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null \
          || { apt-get update -q >/dev/null \
               && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null; }
        bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
      fi
      if [ -z "$bindir" ]; then
        echo "test services: no PostgreSQL available; the postgres tests will fail" >&2
        return 1
      fi
      local dir=/tmp/herald-test-pg run=()
      [ "$(id -u)" -eq 0 ] && run=(runuser -u postgres --)
      rm -rf "$dir" && mkdir -p "$dir" && chown "$([ "$(id -u)" -eq 0 ] && echo postgres || id -un)" "$dir"
      "${run[@]}" "$bindir/initdb" -D "$dir/data" -A trust -U postgres --no-sync >/dev/null
      "${run[@]}" "$bindir/pg_ctl" -D "$dir/data" -w -l "$dir/log" \
        -o "-c listen_addresses=127.0.0.1 -p 55432 -k $dir -c fsync=off" start >/dev/null
      "${run[@]}" "$bindir/createdb" -h 127.0.0.1 -p 55432 -U postgres test
    fi
  fi
  echo "$dsn" > .test-services/postgres.dsn
  echo "test services: postgresql at $dsn"
}

ensure_postgres

# --- MariaDB: the MySQL/MariaDB outbox sources (tests/e2e/test_sources.py) ----------------
# The server on 127.0.0.1:3306, root without a password over TCP (each test makes and
# drops a database of its own). Installed from Debian's packages when missing, started
# when down, and root's TCP login opened once. Bounded: 60 s to come up.
mariadb_listening() { (exec 3<>/dev/tcp/127.0.0.1/3306) 2>/dev/null; }
mariadb_root_tcp() {
  "$PY" - <<'PYCODE' >/dev/null 2>&1
import pymysql
pymysql.connect(host="127.0.0.1", port=3306, user="root", password="", connect_timeout=5).close()
PYCODE
}

ensure_mariadb() {
  export PATH="$PATH:/usr/sbin"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if ! mariadb_listening; then
    if ! command -v mariadbd >/dev/null 2>&1; then
      echo "test services: mariadb-server is missing; installing it with apt"
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q mariadb-server >/dev/null \
        || { $sudo apt-get update -q >/dev/null \
             && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q mariadb-server >/dev/null; }
    fi
    if ! mariadb_listening; then
      echo "test services: starting mariadb"
      $sudo service mariadb start >/dev/null 2>&1 \
        || { $sudo mkdir -p /run/mysqld && $sudo chown mysql:mysql /run/mysqld \
             && ($sudo setsid mariadbd-safe --bind-address=127.0.0.1 >/dev/null 2>&1 &); }
    fi
    local deadline=$((SECONDS + 60))
    until mariadb_listening; do
      if ((SECONDS >= deadline)); then
        echo "test services: mariadb did not come up within 60 s" >&2
        return 1
      fi
      sleep 0.5
    done
  fi
  if ! mariadb_root_tcp; then
    # Debian's root logs in through the unix socket only: let the tests in over TCP.
    echo "test services: opening root's TCP login to mariadb (no password, local only)"
    $sudo mariadb -uroot -e "ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket; CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED VIA mysql_native_password USING PASSWORD(''); GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION; FLUSH PRIVILEGES;"
  fi
  echo "test services: mariadb running on 127.0.0.1:3306"
}

ensure_mariadb

# --- nginx: the fast receiver of tests/e2e/test_scaleout.py (and of make bench) --------
# Only the binary is needed: tests run it with a private config on a free port.
ensure_nginx() {
  if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
    echo "test services: nginx present"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "test services: nginx missing and not root; the scale-out tests will skip" >&2
    return 0
  fi
  echo "test services: installing nginx-light with apt"
  local policy=/usr/sbin/policy-rc.d own=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy" && own=1
  fi
  DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q --no-install-recommends \
    nginx-light >/dev/null 2>&1 \
    || { timeout 180 apt-get update -q >/dev/null 2>&1 \
         && DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q \
              --no-install-recommends nginx-light >/dev/null 2>&1; } \
    || echo "test services: could not install nginx; the scale-out tests will skip" >&2
  [ -n "$own" ] && rm -f "$policy"
  # The package's own server must not keep port 80 on the test machine.
  pkill -x nginx 2>/dev/null || true
  return 0
}

ensure_nginx

# --- strace, systemd-analyze, kubectl: tests/e2e/test_systemd.py and test_deploy.py ---
# strace traces a daemon's system calls against the unit's filter; systemd-analyze
# scores the unit; kubectl builds the kustomizations. From Debian when missing.
ensure_tools() {
  local missing=()
  command -v strace >/dev/null 2>&1 || missing+=(strace)
  command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
  command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
  if [ ${#missing[@]} -eq 0 ]; then
    echo "test services: strace, systemd-analyze and kubectl present"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "test services: missing ${missing[*]} and not root; their tests will fail" >&2
    return 0
  fi
  echo "test services: installing ${missing[*]} with apt"
  DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q --no-install-recommends \
    "${missing[@]}" >/dev/null 2>&1 \
    || { timeout 180 apt-get update -q >/dev/null 2>&1 \
         && DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q \
              --no-install-recommends "${missing[@]}" >/dev/null 2>&1; } \
    || echo "test services: could not install ${missing[*]}; their tests will fail" >&2
  return 0
}

ensure_tools

# >>> promtool: tests/e2e/test_deploy.py checks deploy/prometheus/*.yml with it ----------
# Debian's prometheus package ships promtool. Installed only when promtool is missing,
# we are root and apt works; bounded (apt-get under timeout). The prometheus service the
# package brings must not be left running: a policy-rc.d forbids starting it during the
# install, and a server that started anyway is stopped again. Never fails the script:
# without promtool those checks skip.
ensure_promtool() {
  if command -v promtool >/dev/null 2>&1; then
    echo "test services: promtool present at $(command -v promtool)"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "test services: promtool is missing and cannot be installed (needs root and apt-get);" \
      "the promtool checks in tests/e2e/test_deploy.py will skip"
    return 0
  fi
  echo "test services: promtool is missing; installing Debian's prometheus package for it"
  local policy=/usr/sbin/policy-rc.d own_policy="" before
  before=$(pgrep -x prometheus || true)
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# scripts/test-services.sh: no service starts while promtool is installed\nexit 101\n' \
      >"$policy"
    chmod 0755 "$policy"
    own_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  local install=(timeout 300 apt-get -o DPkg::Lock::Timeout=60 -y -q --no-install-recommends
                 install prometheus)
  DEBIAN_FRONTEND=noninteractive "${install[@]}" >/dev/null 2>&1 \
    || { timeout 180 apt-get -o DPkg::Lock::Timeout=60 -q update >/dev/null 2>&1 \
         && DEBIAN_FRONTEND=noninteractive "${install[@]}" >/dev/null 2>&1; } \
    || echo "test services: apt-get install prometheus failed; the promtool checks will skip" >&2
  if [ -n "$own_policy" ]; then
    rm -f "$policy"
    trap - EXIT
  fi
  # Stop a prometheus server the install started after all (only ones that were not
  # running before it), through its init script or by pid.
  local pid
  for pid in $(pgrep -x prometheus || true); do
    if ! grep -qx "$pid" <<<"$before"; then
      echo "test services: stopping the prometheus server the package started (pid $pid)"
      [ -x /etc/init.d/prometheus ] && /etc/init.d/prometheus stop >/dev/null 2>&1
      kill "$pid" 2>/dev/null || true
    fi
  done
  if command -v promtool >/dev/null 2>&1; then
    echo "test services: promtool installed at $(command -v promtool)"
  fi
}
# <<< promtool

ensure_promtool || true

# --- chromium: the console's browser tests (tests/e2e/test_console*.py) -----------------
# Debian's chromium and chromium-driver, driven by Playwright at /usr/bin/chromium (no
# browser download: Playwright only brings its driver). Installed when missing and we
# are root; bounded. Without it the browser tests fail (they never skip).
ensure_chromium() {
  if [ -x /usr/bin/chromium ]; then
    echo "test services: chromium present"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "test services: chromium is missing and cannot be installed (needs root and apt-get);" \
      "the console's browser tests will fail" >&2
    return 0
  fi
  echo "test services: installing chromium and chromium-driver with apt"
  local install=(timeout 600 apt-get -o DPkg::Lock::Timeout=60 -y -q --no-install-recommends
                 install chromium chromium-driver)
  DEBIAN_FRONTEND=noninteractive "${install[@]}" >/dev/null 2>&1 \
    || { timeout 180 apt-get -o DPkg::Lock::Timeout=60 -q update >/dev/null 2>&1 \
         && DEBIAN_FRONTEND=noninteractive "${install[@]}" >/dev/null 2>&1; } \
    || echo "test services: could not install chromium; the console's browser tests will fail" >&2
  return 0
}

ensure_chromium
