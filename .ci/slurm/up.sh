#!/usr/bin/env bash
# Bring up a real Slurm on this one host from Debian's packages: munge, MariaDB + slurmdbd
# (so sacct works), slurmctld and two slurmd, with a `cpu` partition and a `gpu` partition
# whose node shows two fake GPUs as GRES, and a `nodes` partition of two node names on this
# host (the host's own and "<host>-2", a second slurmd on its own port): jobs over two nodes
# run here as they would over two hosts. Runs as root without systemd.
#
# Idempotent: when the cluster is already healthy it prints so and exits 0. Every wait
# is bounded. State, logs, pid files and the database live under $FLASHWATT_SLURM_DIR
# (default /tmp/flashwatt-slurm); /etc/slurm/slurm.conf is a link to the rendered
# config so that clients (sbatch, sacct, submitit) need no environment. down.sh stops
# what this script started.
#
# Environment: FLASHWATT_SLURM_DIR, FLASHWATT_SLURM_CPUS (CPUs the node claims, 16),
# FLASHWATT_SLURM_MEM_MB (memory it claims in MB, 64000), FLASHWATT_SLURM_TIMEOUT_S (per wait, 60).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${FLASHWATT_SLURM_DIR:-/tmp/flashwatt-slurm}
CPUS=${FLASHWATT_SLURM_CPUS:-16}
MEM_MB=${FLASHWATT_SLURM_MEM_MB:-64000}
WAIT_S=${FLASHWATT_SLURM_TIMEOUT_S:-60}
CLUSTER=flashwatt
CTLD_PORT=6817 SLURMD_PORT=6818 DBD_PORT=6819 SLURMD2_PORT=6820 DB_PORT=${FLASHWATT_SLURM_DB_PORT:-3307}
MARKER="rendered by .ci/slurm/up.sh"
START_NS=$(date +%s%N)

log() { printf '[slurm-up %5.1fs] %s\n' "$(( ($(date +%s%N) - START_NS) / 1000000 ))e-3" "$*"; }
die() { log "ERROR: $*"; for f in slurmctld "slurmd-$HOST" "slurmd-$HOST2" slurmdbd; do [[ -f $STATE/log/$f.log ]] && { echo "--- $f.log (tail)"; tail -n 15 "$STATE/log/$f.log"; }; done; exit 1; }

# wait_for DESCRIPTION COMMAND...: retry COMMAND (each try bounded to 5 s) until it succeeds or WAIT_S passes.
wait_for() {
  local what=$1; shift
  local deadline=$((SECONDS + WAIT_S))
  until timeout 5 "$@" >/dev/null 2>&1; do
    (( SECONDS < deadline )) || die "timed out after ${WAIT_S}s waiting for $what"
    sleep 0.2
  done
}

alive() { # alive NAME: the pid in $STATE/run/NAME.pid runs a process whose name starts with NAME
  local pid
  pid=$(cat "$STATE/run/$1.pid" 2>/dev/null) || return 1
  [[ -n $pid && -r /proc/$pid/comm ]] && [[ $(cat "/proc/$pid/comm") == "${2:-$1}"* ]]
}

HOST=$(hostname -s)
HOST2=$HOST-2  # the second node name: a second slurmd on this host
nodes_ready() { # every node of this cluster idle, mixed or allocated
  local state
  for node in "$HOST" "$HOST2"; do
    state=$(timeout 5 sinfo -h -n "$node" -o '%t' 2>/dev/null | sort -u)
    [[ $state =~ ^(idle|mix|alloc)$ ]] || return 1
  done
}

healthy() {
  timeout 5 sh -c 'munge -n </dev/null | unmunge' >/dev/null 2>&1 || return 1
  alive mariadbd && alive slurmdbd && alive slurmctld && alive "slurmd-$HOST" slurmd && alive "slurmd-$HOST2" slurmd \
    || return 1
  nodes_ready || return 1
  timeout 5 sacct -n -X -S now >/dev/null 2>&1
}

[[ $(id -u) == 0 ]] || die "run as root (daemons run as root/munge/mysql)"

# ---- packages ----------------------------------------------------------------------------
need=()
for pair in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge slurmdbd:slurmdbd mariadbd:mariadb-server; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || [[ -x /usr/sbin/${pair%%:*} ]] || need+=("${pair##*:}")
done
if ((${#need[@]})); then
  log "installing ${need[*]}"
  ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1 || timeout 300 apt-get update -qq
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge slurmdbd mariadb-server >/dev/null
fi
export PATH=$PATH:/usr/sbin:/sbin

# ---- folders, host name, fake GPUs -------------------------------------------------------
install -d -m 755 "$STATE" "$STATE"/{etc,run,log,dev,state,state/ctld,state/slurmd}
for name in "$HOST" "$HOST2"; do  # rank 0 of a job over two nodes listens on its node's name
  if ! getent hosts "$name" >/dev/null; then
    echo "127.0.0.1 $name" >> /etc/hosts
    log "mapped $name to 127.0.0.1 in /etc/hosts"
  fi
done
for i in 0 1; do
  dev=$STATE/dev/nvidia$i
  [[ -c $dev ]] && continue
  rm -f "$dev"
  mknod "$dev" c 195 "$i" 2>/dev/null || ln -sf "/dev/tty$((i + 1))" "$dev"
  [[ -c $dev ]] || die "could not make a character device at $dev"
done

# ---- configuration -----------------------------------------------------------------------
DB_PASS_FILE=$STATE/etc/db.pass
[[ -s $DB_PASS_FILE ]] || (umask 077; head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$DB_PASS_FILE")
CHANGED=0
render() { # render TEMPLATE DEST MODE; sets CHANGED=1 when DEST's content changes
  sed -e "s|@STATE@|$STATE|g" -e "s|@HOST@|$HOST|g" -e "s|@HOST2@|$HOST2|g" -e "s|@SLURMD2_PORT@|$SLURMD2_PORT|g" -e "s|@CLUSTER@|$CLUSTER|g" -e "s|@CPUS@|$CPUS|g" \
      -e "s|@MEM_MB@|$MEM_MB|g" -e "s|@DEF_MEM_PER_CPU@|$((MEM_MB / CPUS / 2))|g" \
      -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" -e "s|@DBD_PORT@|$DBD_PORT|g" \
      -e "s|@DB_PORT@|$DB_PORT|g" -e "s|@DB_PASS@|$(cat "$DB_PASS_FILE")|g" "$HERE/$1" > "$2.tmp"
  chmod "$3" "$2.tmp"
  if cmp -s "$2.tmp" "$2"; then rm -f "$2.tmp"; else mv "$2.tmp" "$2"; CHANGED=1; fi
}
render slurm.conf.in "$STATE/etc/slurm.conf" 644
render gres.conf.in "$STATE/etc/gres.conf" 644
render slurmdbd.conf.in "$STATE/etc/slurmdbd.conf" 600
install -d /etc/slurm
for f in slurm.conf gres.conf slurmdbd.conf; do
  target=/etc/slurm/$f
  if [[ -e $target && ! -L $target ]] && ! grep -q "$MARKER" "$target"; then
    die "$target exists and is not ours; move it away to use this test cluster"
  fi
  ln -sfn "$STATE/etc/$f" "$target"
done
export SLURM_CONF=$STATE/etc/slurm.conf

if ((CHANGED == 0)) && healthy; then
  log "already up and healthy: $(timeout 5 sinfo -h -o '%P %a %D %t %G' | tr '\n' ';')"
  exit 0
fi
if ((CHANGED)) && alive slurmctld; then  # node and partition changes need both daemons restarted
  log "configuration changed: restarting slurmctld and slurmd"
  for name in slurmd "slurmd-$HOST" "slurmd-$HOST2" slurmctld; do  # slurmd: a single-node bring-up's pid file
    if alive "$name" "${name%%-*}"; then
      pid=$(cat "$STATE/run/$name.pid"); kill -TERM "$pid"
      for _ in $(seq 100); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
      [[ -d /proc/$pid ]] && kill -KILL "$pid"
    fi
  done
fi

# ---- munge ---------------------------------------------------------------------------------
if ! timeout 5 munge -n </dev/null 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; then
  [[ -s /etc/munge/munge.key ]] || { command -v mungekey >/dev/null && mungekey -c -f -k /etc/munge/munge.key; }
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  install -d -o munge -g munge -m 755 /run/munge
  install -d -o munge -g munge -m 700 /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged --force
  wait_for munge sh -c 'munge -n </dev/null | unmunge'
  cp /run/munge/munged.pid "$STATE/run/munged.pid"
  log "munged started (pid $(cat "$STATE/run/munged.pid"))"
else
  log "munge already answers; using it"
fi

# ---- MariaDB (own data folder under $STATE, TCP on 127.0.0.1:$DB_PORT) ---------------------
DB_DIR=$STATE/mysql
SOCK=$STATE/run/mysqld.sock
if ! alive mariadbd; then
  if [[ ! -d $DB_DIR/mysql ]]; then
    install -d -o mysql -g mysql "$DB_DIR"
    timeout 120 mariadb-install-db --user=mysql --datadir="$DB_DIR" --skip-test-db \
      --auth-root-authentication-method=socket >"$STATE/log/mariadb-install.log" 2>&1 \
      || die "mariadb-install-db failed (see $STATE/log/mariadb-install.log)"
  fi
  chown mysql:mysql "$STATE/run"
  nohup mariadbd --user=mysql --datadir="$DB_DIR" --socket="$SOCK" --port="$DB_PORT" \
    --bind-address=127.0.0.1 --pid-file="$STATE/run/mariadbd.pid" --log-error="$STATE/log/mariadb.log" \
    --skip-log-bin --innodb-buffer-pool-size=32M >/dev/null 2>&1 &
  wait_for MariaDB mariadb-admin --socket="$SOCK" ping
  log "MariaDB started (pid $(cat "$STATE/run/mariadbd.pid"))"
fi
chown root:root "$STATE/run"; chmod 755 "$STATE/run"
timeout 20 mariadb --socket="$SOCK" -e "
  CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$(cat "$DB_PASS_FILE")';
  CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$(cat "$DB_PASS_FILE")';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" || die "could not create the slurm database user"

# ---- slurmdbd, slurmctld, slurmd -----------------------------------------------------------
if ! alive slurmdbd; then
  slurmdbd
  wait_for slurmdbd sacctmgr -n list cluster
  log "slurmdbd started (pid $(cat "$STATE/run/slurmdbd.pid"))"
fi
if ! timeout 5 sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
  timeout 10 sacctmgr -i add cluster "$CLUSTER" >/dev/null
fi
if ! alive slurmctld; then
  slurmctld -i
  wait_for slurmctld scontrol ping
  log "slurmctld started (pid $(cat "$STATE/run/slurmctld.pid"))"
fi
for node in "$HOST" "$HOST2"; do  # the pid file is slurmd-<node>.pid (SlurmdPidFile has %n)
  if ! alive "slurmd-$node" slurmd; then
    slurmd -N "$node"
    wait_for "slurmd $node's pid file" test -s "$STATE/run/slurmd-$node.pid"
    log "slurmd $node started (pid $(cat "$STATE/run/slurmd-$node.pid"))"
  fi
done

deadline=$((SECONDS + WAIT_S))
until nodes_ready; do
  state=$(timeout 5 sinfo -h -o '%n %t' 2>/dev/null | tr '\n' ' ')
  for node in "$HOST" "$HOST2"; do  # a drained node stays drained across restarts
    if [[ $(timeout 5 sinfo -h -n "$node" -o '%t' 2>/dev/null) =~ drain|down ]]; then
      timeout 5 scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
    fi
  done
  (( SECONDS < deadline )) || die "nodes not ready after ${WAIT_S}s (state: ${state:-none}; $(timeout 5 sinfo -h -R 2>/dev/null))"
  sleep 0.3
done

# ---- smoke test: one job through the scheduler and into accounting -------------------------
job=$(timeout 10 sbatch --parsable -p cpu -t 1 -o /dev/null -J up-smoke --wrap true) || die "sbatch failed"
deadline=$((SECONDS + WAIT_S))
until [[ $(timeout 5 sacct -n -X -P -j "$job" -o State 2>/dev/null) == COMPLETED ]]; do
  (( SECONDS < deadline )) || die "smoke job $job did not complete in ${WAIT_S}s (state: $(sacct -n -X -P -j "$job" -o State))"
  sleep 0.2
done
log "smoke job $job COMPLETED"
log "up: $(timeout 5 sinfo -h -o '%P %a %D %t %G' | tr '\n' ';') (state in $STATE)"
printf 'slurm bring-up took %.1f s\n' "$(( ($(date +%s%N) - START_NS) / 1000000 ))e-3"
