#!/usr/bin/env bash
# A small real cluster on this machine: N hosts as network namespaces on one bridge, each with
# its own address (10.77.0.<i>), host name (h<i>, through a UTS namespace per process), /tmp,
# /etc/hosts and CPU share (a cgroup); Open MPI launching across them with an rsh agent that
# enters a host's namespaces (as ssh would log in to it); Slurm, where Debian's is installed:
# munge, slurmctld on h1, a slurmd per host. Nothing is pretended: ranks on different hosts talk
# over TCP through veth links. State: /var/tmp/roofline-cluster-<id> (ROOFLINE_CLUSTER_DIR).
#
#   scripts/cluster.sh up [N]     make N hosts (default 4)
#   scripts/cluster.sh down       remove all of it, whatever state it is in
#   scripts/cluster.sh run HOST CMD...   run CMD on host HOST (h1..hN)
#   scripts/cluster.sh mpi PER HOSTS CMD...   mpirun from h1: PER ranks on each of the first HOSTS
#   scripts/cluster.sh slurm HOST CMD...      a Slurm command on HOST (srun, sbatch, sinfo, squeue)
#   scripts/cluster.sh test [CHECK...]   up, every check (one line each), down; ends "N passed,
#                                 N failed". CHECKs (default all): mpi slurm slow_link
#                                 killed_rank link_down loaded_host; the hosts' own checks
#                                 always run. One check again and again: its noise, alone.
#
# Needs root (namespaces, veth, the bridge, cgroups) and Open MPI's mpirun; says so in one line
# when not.
# ROOFLINE: the binary to test (default target/release/roofline).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# ROOFLINE_CLUSTER_ID (0–200) keeps two clusters on one machine apart: their namespaces,
# bridge, subnet and state folder.
id=${ROOFLINE_CLUSTER_ID:-0}
case $id in '' | *[!0-9]*) echo "ROOFLINE_CLUSTER_ID: expected 0 to 200, got '$id'" >&2; exit 2 ;; esac
[ "$id" -le 200 ] || { echo "ROOFLINE_CLUSTER_ID: expected 0 to 200, got $id" >&2; exit 2; }
prefix=rl${id}h
bridge=rl${id}br
net=10.77.$id
# Outside /tmp: every host has a /tmp of its own (as real hosts do; Slurm's PMIx plugin keys its
# folders there by job and step alone), which would hide a state folder under the machine's.
state=${ROOFLINE_CLUSTER_DIR:-/var/tmp/roofline-cluster-$id}
# Each host's share of the CPUs, for the loaded-host check: a cgroup (v1 cpu controller) per
# host, so that a load on one host takes that host's share and not the others' (as each real
# host has cores of its own). Absent where the controller is not mounted: the check says so.
cgroot=/sys/fs/cgroup/cpu
cg=$cgroot/roofline-cluster-$id
case $state in /tmp | /tmp/*) echo "ROOFLINE_CLUSTER_DIR: not under /tmp (each host has its own /tmp, which hides it): $state" >&2; exit 2 ;; esac

need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "scripts/cluster.sh needs root (network namespaces, veth links and a bridge); run it as root or under sudo" >&2
        exit 2
    fi
    command -v ip >/dev/null || { echo "scripts/cluster.sh needs iproute2's ip" >&2; exit 2; }
}

hosts() { cat "$state/hosts" 2>/dev/null; }

up() {
    local n=${1:-4}
    case $n in '' | *[!0-9]*) echo "up: expected a number of hosts, got '$n'" >&2; exit 2 ;; esac
    [ "$n" -ge 2 ] && [ "$n" -le 32 ] || { echo "up: 2 to 32 hosts, not $n" >&2; exit 2; }
    down >/dev/null 2>&1
    mkdir -p "$state"
    ip link add "$bridge" type bridge || return 1
    ip link set "$bridge" up
    : >"$state/hosts"
    : >"$state/hostfile"
    for i in $(seq 1 "$n"); do
        local ns=$prefix$i
        ip netns add "$ns" || return 1
        ip link add "veth-$ns" type veth peer name eth0 netns "$ns" || return 1
        ip link set "veth-$ns" master "$bridge" up
        ip netns exec "$ns" ip link set lo up
        ip netns exec "$ns" ip addr add "$net.$i/24" dev eth0
        ip netns exec "$ns" ip link set eth0 up
        echo "h$i $net.$i" >>"$state/hosts"
        mkdir -p "$state/host/h$i/tmp"
        chmod 1777 "$state/host/h$i/tmp"
    done
    if [ -w "$cgroot/cgroup.procs" ] && mkdir -p "$cg"; then
        for i in $(seq 1 "$n"); do mkdir -p "$cg/h$i"; done
        # Where every host's commands read it (the cgroup file system is not mounted inside);
        # copied to $state/cgroup, which makes new commands join, only while a check needs it.
        echo "${cg#"$cgroot"/}" >"$state/cgroup.path"
    fi
    # Every host resolves every other's name, as on a cluster (its own /etc/hosts, bound over
    # the machine's in its mount namespace only).
    { echo "127.0.0.1 localhost"; awk '{print $2 " " $1}' "$state/hosts"; } >"$state/etc-hosts"
    # The agent Open MPI's launcher calls instead of ssh: `agent HOST CMD...` runs CMD, as a
    # remote shell would, in HOST's namespaces.
    # (This script's copy: a host's /tmp is its own, and this checkout may be under /tmp.)
    mkdir -p "$state/bin"
    cp "$here/cluster.sh" "$state/bin/cluster.sh"
    cat >"$state/agent" <<EOF
#!/bin/sh
host=\$1; shift
exec "$state/bin/cluster.sh" run "\$host" sh -c "\$*"
EOF
    chmod +x "$state/agent"
    local slurm="no Slurm (Debian's slurmctld, slurmd, slurm-client and munge are not installed)"
    if have_slurm; then
        slurm_up "$n" || return 1
        slurm="Slurm: slurmctld on h1, a slurmd on each host, partition rl (SLURM_CONF=$state/slurm/slurm.conf)"
    fi
    echo "up: $n hosts (h1..h$n, $net.1..$net.$n) on bridge $bridge; $slurm; state in $state"
}

have_slurm() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
        command -v munged >/dev/null && command -v srun >/dev/null
}

# Slurm as a cluster runs it: munge (one daemon, its socket shared by every host, as one key
# is shared by every node), slurmctld on h1, one slurmd per host under its own node name, every
# file in $state/slurm. slurmd needs the cgroup file systems, which ip netns exec's fresh /sys
# lacks: each host mounts the machine's cgroup v1 hierarchies again in its own mount
# namespace (the same hierarchies; nothing is created in them: proctrack/linuxproc and
# task/none track and bind nothing through cgroups).
slurm_up() {
    local n=$1 sd=$state/slurm md=$state/munge
    mkdir -p "$sd/ctld" "$md/key"
    chmod 755 "$md"
    chmod 700 "$md/key"
    head -c 1024 /dev/urandom >"$md/key/munge.key"
    chmod 600 "$md/key/munge.key"
    munged -f --socket="$md/socket" --key-file="$md/key/munge.key" --log-file="$md/munged.log" \
        --pid-file="$md/munged.pid" --seed-file="$md/seed" ||
        { echo "up: munged did not start (see $md/munged.log)" >&2; return 1; }
    {
        echo "# The cluster scripts/cluster.sh made: $n hosts as network namespaces."
        echo "ClusterName=rl$id"
        echo "SlurmctldHost=h1($net.1)"
        echo "AuthType=auth/munge"
        echo "AuthInfo=socket=$md/socket"
        echo "CredType=cred/munge"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "StateSaveLocation=$sd/ctld"
        echo "SlurmdSpoolDir=$sd/spool-%n"
        echo "SlurmctldPidFile=$sd/slurmctld.pid"
        echo "SlurmdPidFile=$sd/slurmd-%n.pid"
        echo "SlurmctldLogFile=$sd/slurmctld.log"
        echo "SlurmdLogFile=$sd/slurmd-%n.log"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "SchedulerType=sched/builtin"
        echo "SelectType=select/linear"
        echo "MpiDefault=pmix"
        echo "ReturnToService=2"
        echo "SlurmdParameters=config_overrides"
        for i in $(seq 1 "$n"); do
            echo "NodeName=h$i NodeAddr=$net.$i CPUs=2 State=UNKNOWN"
        done
        echo "PartitionName=rl Nodes=h[1-$n] Default=YES MaxTime=INFINITE State=UP"
    } >"$sd/slurm.conf"
    for i in $(seq 1 "$n"); do mkdir -p "$sd/spool-h$i"; done
    slurm h1 slurmctld -f "$sd/slurm.conf" ||
        { echo "up: slurmctld did not start (see $sd/slurmctld.log)" >&2; return 1; }
    for i in $(seq 1 "$n"); do
        slurm "h$i" sh -c '
            mount -t tmpfs cgroups /sys/fs/cgroup || exit 1
            for c in cpuset cpu cpuacct memory devices freezer pids; do
                mkdir /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c || exit 1
            done
            mkdir /sys/fs/cgroup/systemd &&
                mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd || exit 1
            exec slurmd -f "$SLURM_CONF" -N "$(hostname)"' ||
            { echo "up: h$i's slurmd did not start (see $sd/slurmd-h$i.log)" >&2; return 1; }
    done
    # Every node idle before anything is submitted.
    for _ in $(seq 1 100); do
        [ "$(slurm h1 sinfo -h -t idle -o %D 2>/dev/null)" = "$n" ] && return 0
        sleep 0.2
    done
    echo "up: the $n slurmd did not all register with slurmctld within 20 s (see $sd)" >&2
    return 1
}

# A command on a host against this cluster's Slurm: `slurm HOST CMD...` (srun, sbatch, sinfo).
slurm() {
    local host=$1
    shift
    # Open MPI over the bridge only, its waiting ranks yielding the two shared cores (as mpi
    # passes to mpirun; srun and sbatch pass the environment on to every task).
    SLURM_CONF=$state/slurm/slurm.conf OMPI_MCA_btl=tcp,vader,self \
        OMPI_MCA_btl_tcp_if_include="$net.0/24" OMPI_MCA_oob_tcp_if_include="$net.0/24" \
        OMPI_MCA_mpi_yield_when_idle=1 "$here/cluster.sh" run "$host" "$@"
}

down() {
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix" || true); do
        # Every process still in the host's namespace goes first.
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    done
    ip link del "$bridge" 2>/dev/null
    # The hosts' cgroups, once their processes are gone (a killed process leaves its cgroup
    # a moment later).
    if [ -d "$cg" ]; then
        for _ in $(seq 1 50); do
            for d in "$cg"/h*; do [ -d "$d" ] && rmdir "$d" 2>/dev/null; done
            rmdir "$cg" 2>/dev/null && break
            sleep 0.1
        done
    fi
    # munged is the machine's (one socket serves every host).
    [ -f "$state/munge/munged.pid" ] && kill "$(cat "$state/munge/munged.pid")" 2>/dev/null
    rm -rf "$state"
    echo "down: no host, bridge or state left"
}

# The namespace of a host given by name (h3) or address (10.77.0.3).
ns_of() {
    local h=$1
    case $h in
        h[0-9]*) echo "$prefix${h#h}" ;;
        "$net".*) echo "$prefix${h##*.}" ;;
        *) echo "no such host: $h (h1..hN or $net.i)" >&2; return 2 ;;
    esac
}

run_on() {
    local host=$1; shift
    local ns
    ns=$(ns_of "$host") || exit 2
    ip netns list | grep -q "^$ns\b" || { echo "host $host is not up" >&2; exit 2; }
    local name=h${ns#"$prefix"}
    # ip netns exec gives the command a mount namespace of its own (slave to the machine's):
    # the host's /tmp and /etc/hosts are bound there, nowhere else. The command joins the
    # host's cgroup through the cpu hierarchy mounted there for a moment (the fresh /sys that
    # ip netns exec mounts has none, and this may run from inside another host: mpirun's agent).
    exec ip netns exec "$ns" unshare --uts sh -c '
        hostname "$0" && mount --bind "$1/host/$0/tmp" /tmp && mount --bind "$1/etc-hosts" /etc/hosts || exit 1
        # A working folder under the machine'"'"'s /tmp is not on the host: start at / instead.
        cd "$PWD" 2>/dev/null || cd /
        if [ -n "$2" ]; then
            mount -t cgroup -o cpu cgroup /sys/fs/cgroup &&
                echo $$ >"/sys/fs/cgroup/$2/$0/cgroup.procs" && umount /sys/fs/cgroup || exit 1
        fi
        shift 2
        exec "$@"' "$name" "$state" "$(cat "$state/cgroup" 2>/dev/null)" "$@"
}

# mpirun across the hosts: `mpi PER_HOST N_HOSTS CMD...` from h1, over TCP on the bridge only.
mpi() {
    local per=$1 nh=$2; shift 2
    local hf=$state/hostfile.$per.$nh
    head -n "$nh" "$state/hosts" | awk -v s="$per" '{print $2 " slots=" s}' >"$hf"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        "$here/cluster.sh" run h1 mpirun --hostfile "$hf" -np $((per * nh)) \
        --mca plm_rsh_agent "$state/agent" --mca plm_rsh_no_tree_spawn 1 \
        --mca btl tcp,vader,self --mca btl_tcp_if_include "$net.0/24" --mca mpi_yield_when_idle 1 \
        --mca oob_tcp_if_include "$net.0/24" \
        -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
        "$@"
}

# How many roofline processes are still running on the hosts.
ranks_left() {
    local left=0
    for i in $(seq 1 "$(wc -l <"$state/hosts")"); do
        for p in $(ip netns pids "$prefix$i" 2>/dev/null); do
            [ "$(cat "/proc/$p/comm" 2>/dev/null)" = roofline ] && left=$((left + 1))
        done
    done
    echo "$left"
}

passed=0
failed=0
# Each line starts with pass or FAIL and the seconds since the test began, when it was judged
# (where the harness's minutes go).
check() {
    local name=$1 ok=$2 detail=$3 verdict=pass
    if [ "$ok" = 0 ]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        verdict=FAIL
    fi
    printf '%-4s %4ss  %-40s %s\n' "$verdict" "$SECONDS" "$name" "$detail"
}

# `probe_run LABEL HOW NAME ARGS...`: `$rl probe --quick ARGS` launched from h1 on the four
# hosts, HOW ranks on each under mpirun (or `srun`: srun -N4, through Slurm), into
# $out/machine-NAME.json (its log probe-NAME.log), checked as LABEL: its exit, and the probe's
# own words when it failed (the folder goes with the hosts). Succeeds when the result file was
# written. (rl and out: the caller's.)
probe_run() {
    local label=$1 how=$2 name=$3
    shift 3
    local launch=(mpi "$how" 4)
    [ "$how" = srun ] && launch=(slurm h1 srun -N4)
    timeout 300 env -u ROOFLINE_FAKE_NODES "$here/cluster.sh" "${launch[@]}" "$rl" probe --quick \
        "$@" -o "$out/machine-$name.json" >"$out/probe-$name.log" 2>&1
    local rc=$?
    check "$label" $rc "exit $rc"
    [ "$rc" = 0 ] || tail -n 5 "$out/probe-$name.log" | sed 's/^/      /'
    [ -f "$out/machine-$name.json" ]
}

# One link slowed: between h2 and h3 only. The pair gets a cable of its own (a veth between
# the two hosts, with a /32 route to each other through it), limited to 500 Mbit/s each way (a
# token bucket, a tenth of a link here); all other traffic stays on eth0, untouched. (A
# classifier on eth0 put every packet of h2 and h3 through the shaper, whose cost made their
# other links read slow too on a loaded runner; this kernel has no policing action.) A rate
# limit only: this kernel has no netem (CONFIG_NET_SCH_NETEM is not set), so no delay can be
# added. The cable goes when the check ends (deleting one end deletes both, and the routes).
slow_link() {
    local rl=$1 out=$2
    local ok=0 a=${prefix}s2 b=${prefix}s3
    ip link add "$a" type veth peer name "$b" &&
        ip link set "$a" netns "${prefix}2" && ip link set "$b" netns "${prefix}3" || ok=1
    for pair in "2 3 $a" "3 2 $b"; do
        set -- $pair
        local ns=$prefix$1
        [ "$ok" = 0 ] &&
            ip netns exec "$ns" ip link set "$3" up &&
            ip netns exec "$ns" ip route add "$net.$2/32" dev "$3" src "$net.$1" &&
            ip netns exec "$ns" tc qdisc add dev "$3" root tbf rate 500mbit burst 256kb latency 50ms ||
            ok=1
    done
    check "tc slows the h2 - h3 link alone" $ok "a cable of their own, TBF 500 Mbit/s each way"
    local m=$out/machine-slow.json
    # A margin of 50%: the slowed cable is a tenth of a link, 90% short, and is named at any
    # margin below that; the other links' noise here is not a real cluster's (four hosts' ranks
    # on two shared cores: a link can read 30-60% short in its round and again alone, 1 run in
    # 10 at the default 10%, docs/cluster.md).
    probe_run "mpirun with a slow link: probe --quick" 1 slow --only comm --max-size 4M --fleet-margin 50
    local ran=$?
    ip netns exec "${prefix}2" ip link del "$a" 2>/dev/null
    [ "$ran" = 0 ] || return
    python3 - "$m" >"$out/check-slow.txt" 2>&1 <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
links = (m.get("fleet") or {}).get("links") or {}
slow = links.get("slow", [])
pairs = sorted({tuple(sorted((s["host_a"], s["host_b"]))) for s in slow})
outliers = [o for o in (m.get("fleet") or {}).get("outliers", []) if o["id"].startswith("cpu/")]
again = sorted(tuple(sorted((links["hosts"][l["a"]], links["hosts"][l["b"]]))) for l in links.get("links", []) if l.get("again") is not None)
print(f"slow pairs {pairs} ({', '.join(s['metric'] for s in slow)}), suspects {[s['host'] for s in links.get('suspects', [])]}, CPU outliers {len(outliers)}; measured again {again}")
# The limit is a rate (no netem here): the bandwidth findings are that pair's alone. Latency
# findings are printed, not held to: four hosts' ranks share two cores, and a rank scheduled
# late reads as a slow round trip on any pair.
bw = sorted({tuple(sorted((s["host_a"], s["host_b"]))) for s in slow if s["metric"] == "bandwidth"})
# The slowed pair read slow in its round and again alone (a link measured again keeps the better
# of its two figures: noise on another pair has to strike twice to name it).
sys.exit(0 if bw == [("h2", "h3")] and ("h2", "h3") in again and not links.get("suspects") and not outliers else 1)
EOF
    check "  bandwidth: h2 - h3 alone, no host, no CPU" $? "$(head -1 "$out/check-slow.txt")"
}

# A rank killed mid-probe (SIGKILL to h3's roofline, a few seconds in): the run ends, not
# hangs, with an error that names what died; no rank is left; a result file, if any, is whole.
killed_rank() {
    local rl=$1 out=$2
    local m=$out/machine-killed.json
    local t0=$SECONDS
    timeout 120 env -u ROOFLINE_FAKE_NODES "$here/cluster.sh" mpi 1 4 "$rl" probe --quick --only comm \
        --max-size 4M --comm-timeout 20 -o "$m" >"$out/probe-killed.log" 2>&1 &
    local job=$! victim=""
    for _ in $(seq 1 100); do
        sleep 0.1
        victim=$(for p in $(ip netns pids "${prefix}3" 2>/dev/null); do
            [ "$(cat "/proc/$p/comm" 2>/dev/null)" = roofline ] && echo "$p"
        done | head -n 1)
        [ -n "$victim" ] && break
    done
    sleep 3
    [ -n "$victim" ] && kill -9 "$victim"
    wait "$job"
    local rc=$? took=$((SECONDS - t0))
    [ -n "$victim" ] && [ "$rc" != 0 ] && [ "$rc" != 124 ]
    check "a rank killed: the run ends" $? "h3's roofline (pid ${victim:-none}) killed; exit $rc after ${took} s"
    grep -qiE "signal 9|killed|exited on signal|rank 2" "$out/probe-killed.log"
    check "  with an error naming what died" $? "$(grep -iE -m1 "signal 9|killed|exited on signal" "$out/probe-killed.log" | cut -c1-90)"
    local left
    left=$(ranks_left)
    local whole=0
    [ ! -e "$m" ] || python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$m" 2>/dev/null || whole=1
    [ "$left" = 0 ] && [ "$whole" = 0 ]
    check "  no rank left, nothing torn" $? "$left ranks left; result $([ -e "$m" ] && echo whole || echo "not written")"
}

# A link down during the link rounds: h3's eth0 taken down once the root has written the file
# it keeps before round 1. The pair with h3 cannot finish; the watchdog (--comm-timeout 15)
# names the round's pair and both hosts within the limit, and the file holds what was
# measured before the round (marked incomplete). Then the link comes back: mpirun cannot reap
# a daemon on a host it cannot reach (it waits on TCP, and segfaults when killed), so
# without it the run's end would test Open MPI's launcher, not roofline. The run must then
# end non-zero at once and leave no rank.
link_down() {
    local rl=$1 out=$2 limit=15
    local m=$out/machine-down.json log=$out/probe-down.log
    local t0=$SECONDS
    timeout 150 env -u ROOFLINE_FAKE_NODES "$here/cluster.sh" mpi 1 4 "$rl" probe --quick --only comm \
        --max-size 4M --comm-timeout "$limit" -o "$m" >"$log" 2>&1 &
    local job=$! down_at="" said_at="" up_at=""
    for _ in $(seq 1 1200); do
        if [ -s "$m" ]; then
            ip netns exec "${prefix}3" ip link set eth0 down && down_at=$((SECONDS - t0))
            break
        fi
        kill -0 "$job" 2>/dev/null || break
        sleep 0.05
    done
    if [ -n "$down_at" ]; then
        for _ in $(seq 1 $(((limit + 15) * 10))); do
            grep -q "did not complete within" "$log" && { said_at=$((SECONDS - t0)); break; }
            sleep 0.1
        done
    fi
    ip netns exec "${prefix}3" ip link set eth0 up 2>/dev/null
    up_at=$((SECONDS - t0))
    wait "$job"
    local rc=$? took=$((SECONDS - t0))
    [ -n "$said_at" ] && [ $((said_at - down_at)) -le $((limit + 3)) ]
    check "a link down: the watchdog fires in time" $? "h3's link down at ${down_at:-never} s, the first rank's error at ${said_at:-never} s (--comm-timeout $limit)"
    [ -n "$down_at" ] && [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ $((took - up_at)) -le 30 ]
    check "  the run ends, non-zero" $? "link up again at $up_at s; exit $rc at $took s"
    local said
    said=$(grep -m1 "did not complete within" "$out/probe-down.log" | sed 's/^roofline: error: //')
    echo "$said" | grep -qE "link round [0-9]+ of [0-9]+.*h3" && echo "$said" | grep -qE "node [0-9] \(h[124]\)"
    check "  the watchdog names the pair and both hosts" $? "$(echo "$said" | cut -c1-110)"
    python3 - "$m" >"$out/check-down.txt" 2>&1 <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
links = (m.get("fleet") or {}).get("links") or {}
inter = [c["id"] for c in m.get("ceilings", []) if "/inter" in c["id"]]
print(f"{len(inter)} inter-node ceilings kept; links: {links.get('incomplete')}")
sys.exit(0 if inter and links.get("incomplete") else 1)
EOF
    check "  what was measured is written" $? "$(head -1 "$out/check-down.txt" | cut -c1-110)"
    local left
    left=$(ranks_left)
    [ "$left" = 0 ]
    check "  no rank left" $? "$left ranks left"
}

# A loaded host: busy loops on h3 while the four hosts probe their FMA ceilings. Each host has
# an equal share of the machine's CPUs (its cgroup), so the loops take h3's share alone: h3 is
# named an outlier, with a cause (the lower clock its probe measured, time-sliced with the
# loops), the one farthest short. Without the per-host cgroups (no v1 cpu controller) a load on
# one host is a load on all, and the check says so instead.
loaded_host() {
    local rl=$1 out=$2
    if [ ! -s "$state/cgroup.path" ]; then
        echo "skip  a loaded host: no per-host CPU share here (no cgroup v1 cpu controller at $cgroot): a load on one host would be a load on all"
        [ -z "${ROOFLINE_SKIPPED:-}" ] ||
            echo "the cluster harness's loaded-host check: needs the cgroup v1 cpu controller at $cgroot" >>"$ROOFLINE_SKIPPED"
        return
    fi
    # For this check each host gets a fixed quarter of the machine's CPUs (a CFS quota):
    # otherwise a host whose peers are idle for a moment runs at the machine's full speed, and
    # each ceiling's best sample hides its load. The period is 10 ms, shorter than a quick
    # probe's sample: a sample spans whole periods, where with a 100 ms period an idle host's
    # 10 ms sample fell in a burst (full speed) or across a throttle (a sixth) by chance.
    local ncpu period=10000 quota
    ncpu=$(nproc)
    quota=$((ncpu * period / 4))
    for i in 1 2 3 4; do
        echo "$period" >"$cg/h$i/cpu.cfs_period_us" && echo "$quota" >"$cg/h$i/cpu.cfs_quota_us"
    done
    # Only for this check: in a cgroup of its own a rank's sched_yield (mpi_yield_when_idle)
    # yields to nothing of the other hosts, and the link rounds' waiting ranks would spin.
    cp "$state/cgroup.path" "$state/cgroup"
    # Two loops pinned to each CPU: wherever the probe pins its thread, it takes turns with
    # loops on that CPU. (Unpinned, the balancer at times put every loop on the other CPU,
    # where they only drew on h3's quota beside the probe: h3 ran at half its share, not a
    # third, and was not named in one run of two.) A loaded host's own samples are noisy, and
    # the fleet's rule allows a node its own samples' spread: 32 runs in 32 named h3 here
    # (docs/cluster.md), but with three loops a CPU one in 15 named nobody, so up to three
    # runs, as the slowed link's pairs are measured again.
    local try ran=0 named=1 tries=3
    for try in $(seq 1 "$tries"); do
        local loops=() c
        for c in $(seq 0 $((ncpu - 1))); do
            for _ in 1 2; do
                "$here/cluster.sh" run h3 taskset -c "$c" sh -c 'while :; do :; done' &
                loops+=($!)
            done
        done
        sleep 0.5
        local label="a loaded host (h3): probe --quick"
        [ "$try" = 1 ] || label="$label, run $try"
        probe_run "$label" 1 loaded --only fma --threads 1
        ran=$?
        kill "${loops[@]}" 2>/dev/null
        wait "${loops[@]}" 2>/dev/null
        [ "$ran" = 0 ] || break
        python3 - "$out/machine-loaded.json" >"$out/check-loaded.txt" 2>&1 <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
out = (m.get("fleet") or {}).get("outliers", [])
mine = [o for o in out if o["host"] == "h3"]
rest = [o for o in out if o["host"] != "h3"]
causes = sorted({c["cause"] for o in mine for c in o["causes"]})
worst = max((o["short_by"] for o in mine), default=0)
noise = max((o["short_by"] for o in rest), default=0)
explained = sorted({o["host"] for o in rest if o["causes"]})
bare = [o["id"] for o in mine if not o["causes"]]
print(f"h3: {len(mine)} outliers, up to {worst:.0%} short, causes {causes}{f' (none on {bare})' if bare else ''}; others (the shared cores' noise): {len(rest)}, up to {noise:.0%}, with a cause: {explained or 'none'}")
# The loaded host is named with its cause and is the one farthest short; the hosts that share
# this machine's two cores are named too at times, but with no cause the probe can see. (Not
# every one of h3's outliers need carry the cause: the clock is measured once per thread count,
# and on these shared cores one measurement can fall in a moment h3 had its share.)
sys.exit(0 if causes and not explained and worst > noise else 1)
EOF
        named=$?
        [ "$named" = 0 ] && break
        [ "$try" = "$tries" ] || echo "      run $try: $(head -1 "$out/check-loaded.txt"); again"
    done
    for i in 1 2 3 4; do echo -1 >"$cg/h$i/cpu.cfs_quota_us"; done
    rm -f "$state/cgroup"
    [ "$ran" = 0 ] || return
    local which=""
    [ "$try" = 1 ] || which=" (run $try of $tries)"
    check "  h3 named, the one with a cause" "$named" "$(head -1 "$out/check-loaded.txt")$which"
}

# `job_exit JOB LIMIT`: waits up to LIMIT seconds for Slurm job JOB to end and prints its exit
# code (a job killed by a signal: 128 + the signal); fails when it did not end in time.
job_exit() {
    # (Not `state`: that is the harness's folder, which `slurm` reads.)
    local job=$1 limit=$2 info job_state code
    for _ in $(seq "$limit"); do
        info=$(slurm h1 scontrol -o show job "$job" 2>/dev/null)
        job_state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$info")
        case $job_state in
            "" | PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED) sleep 1 ;;
            *)
                code=$(sed -n 's/.* ExitCode=\([0-9]*\):\([0-9]*\).*/\1 \2/p' <<<"$info")
                local status signal
                read -r status signal <<<"$code"
                if [ -z "$status" ]; then echo 1
                elif [ "${signal:-0}" != 0 ]; then echo $((128 + signal))
                else echo "$status"; fi
                return 0
                ;;
        esac
    done
    return 1
}

# Slurm: four idle nodes; srun across them; `srun -N4 roofline probe --quick` (the launch read
# from Slurm's environment: its node names, the job and step); the README's batch script,
# scripts/roofline.sbatch, submitted as it is and waited for. Where Debian's Slurm is not
# installed: one line, failed under CI=true, else skipped.
slurm_checks() {
    local rl=$1 out=$2
    if ! have_slurm; then
        if [ "${CI:-}" = true ]; then
            check "Slurm" 1 "CI=true and Debian's slurmctld, slurmd, slurm-client or munge is missing"
        else
            echo "skip  Slurm: Debian's slurmctld, slurmd, slurm-client and munge are not installed (scripts/install-test-tools.sh)"
            [ -z "${ROOFLINE_SKIPPED:-}" ] ||
                echo "the cluster harness's Slurm checks (scripts/cluster.sh test): need Debian's slurmctld, slurmd, slurm-client and munge" >>"$ROOFLINE_SKIPPED"
        fi
        return
    fi
    local idle
    idle=$(slurm h3 sinfo -h -t idle -o "%D %N" 2>&1)
    [ "$idle" = "4 h[1-4]" ]
    check "Slurm: four idle nodes" $? "sinfo from h3: $idle"
    local names
    names=$(timeout 60 "$here/cluster.sh" slurm h1 srun -N4 hostname 2>"$out/srun-hostname.log" | sort | tr '\n' ' ')
    [ "$names" = "h1 h2 h3 h4 " ]
    check "  srun -N4 hostname" $? "$names"
    [ "$names" = "h1 h2 h3 h4 " ] || tail -n 5 "$out/srun-hostname.log" | sed 's/^/      /'
    probe_run "  srun -N4 roofline probe --quick" srun srun --only fma,comm --threads 1 --max-size 4M
    launched "$out/machine-srun.json" srun "$out/check-srun.txt"
    check "    nodes and job from Slurm" $? "$(head -1 "$out/check-srun.txt")"
    # The batch script as the README gives it, its probe options from the environment.
    local job rc
    cp "$root/scripts/roofline.sbatch" "$state/bin/"
    job=$(timeout 60 env ROOFLINE="$rl" ROOFLINE_PROBE_ARGS="--quick --only fma,comm --threads 1 --max-size 4M" \
        "$here/cluster.sh" slurm h1 sbatch --parsable --chdir="$out" "$state/bin/roofline.sbatch" 2>"$out/sbatch.err")
    rc=$?
    # The job's end, polled each second (sbatch --wait sleeps 2, 8, then 32 s between its
    # polls: a 22 s job was seen to end at 42 s), and its exit code as Slurm kept it.
    [ "$rc" = 0 ] && { rc=$(job_exit "$job" 300) || rc=1; }
    check "  sbatch scripts/roofline.sbatch" "$rc" "job ${job:-none}, exit $rc"
    [ "$rc" = 0 ] || { cat "$out/sbatch.err" "$out/roofline-$job.out" 2>/dev/null | tail -n 5 | sed 's/^/      /'; }
    launched "$out/roofline-$job.json" srun "$out/check-sbatch.txt"
    check "    roofline-$job.json from the job's nodes" $? "$(head -1 "$out/check-sbatch.txt")"
}

# `launched FILE BY TXT`: FILE's per-node table holds h1..h4 and its launcher is BY, with a
# Slurm job; a line into TXT.
launched() {
    python3 - "$1" "$2" >"$3" 2>&1 <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
c = m["provenance"].get("cluster") or {}
l = c.get("launcher") or {}
job = (l.get("slurm") or {})
hosts = sorted(n.get("host") for n in m.get("nodes", []))
print(f"per-node table {hosts}; launched by {l.get('by')}, Slurm job {job.get('id')} on {job.get('nodelist')}")
sys.exit(0 if hosts == ["h1", "h2", "h3", "h4"] and l.get("by") == sys.argv[2] and job.get("id") else 1)
EOF
}

# `wanted CHECK`: whether `scripts/cluster.sh test` was asked for CHECK (all when none named).
wanted() {
    [ ${#only[@]} = 0 ] && return 0
    local c
    for c in "${only[@]}"; do [ "$c" = "$1" ] && return 0; done
    return 1
}

run_test() {
    only=("$@")
    SECONDS=0
    local c
    for c in "${only[@]}"; do
        case $c in
            mpi | slurm | slow_link | killed_rank | link_down | loaded_host) ;;
            *) echo "test: no check '$c' (mpi slurm slow_link killed_rank link_down loaded_host)" >&2; exit 2 ;;
        esac
    done
    local rl=${ROOFLINE:-$root/target/release/roofline}
    [ -x "$rl" ] || { echo "test: no roofline binary at $rl (cargo build --release --features mpi, or set ROOFLINE)" >&2; exit 2; }
    command -v mpirun >/dev/null || { echo "test: needs Open MPI's mpirun" >&2; exit 2; }
    # Whatever ends the test (a failed check, Ctrl-C, a kill), the hosts go with it.
    trap 'down >/dev/null 2>&1' EXIT
    trap 'down >/dev/null 2>&1; echo "interrupted: the hosts are down" >&2; exit 130' INT TERM
    up 4 >/dev/null || { echo "test: could not make the hosts" >&2; exit 1; }
    local out=$state/out
    mkdir -p "$out" "$state/bin"
    # The binary where every host sees it (a host's /tmp is its own), as a cluster's shared
    # file system holds it.
    cp "$rl" "$state/bin/roofline" || { echo "test: cannot copy $rl into $state/bin" >&2; exit 1; }
    rl=$state/bin/roofline
    # Each host is its own: a name and an address of its own, and a link to every other.
    local names
    # (mpirun's warnings go to its log: CI's runner gets a harmless "plm:rsh: setpgid failed".)
    names=$(timeout 60 "$here/cluster.sh" mpi 1 4 hostname 2>"$out/names.log" | sort | tr '\n' ' ')
    [ "$names" = "h1 h2 h3 h4 " ]
    check "four hosts, four names" $? "$names"
    [ "$names" = "h1 h2 h3 h4 " ] || tail -n 5 "$out/names.log" | sed 's/^/      /'
    # A TCP connection from h2 to h4's address, nothing else between them.
    "$here/cluster.sh" run h4 python3 -c 'import socket,sys; s=socket.socket(); s.bind((sys.argv[1],7777)); s.listen(1); c,a=s.accept(); c.sendall(a[0].encode())' "$net.4" &
    sleep 0.5
    local seen
    seen=$("$here/cluster.sh" run h2 python3 -c 'import socket,sys; s=socket.create_connection((sys.argv[1],7777),timeout=3); print(s.recv(64).decode())' "$net.4" 2>&1)
    wait
    [ "$seen" = "$net.2" ]
    check "h2 reaches h4 over the bridge" $? "h4 saw a connection from $seen"
    for per in 1 2; do
        wanted mpi || break
        local m=$out/machine-$per.json
        probe_run "mpirun $per rank(s) a host: probe --quick" "$per" "$per" --only fma,comm \
            --threads 1 --max-size 4M || continue
        python3 - "$m" >"$out/check-$per.txt" 2>&1 <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
hosts = sorted(n.get("host") for n in m.get("nodes", []))
inter = [c["id"] for c in m.get("ceilings", []) if "/inter" in c["id"]]
links = (m.get("fleet") or {}).get("links") or {}
pairs = len(links.get("links", []))
print(f"per-node table {hosts}, {len(inter)} inter-node ceilings, link matrix of {pairs} pairs over {links.get('hosts')}")
sys.exit(0 if hosts == ["h1", "h2", "h3", "h4"] and inter and pairs == 6 else 1)
EOF
        check "  hosts, collectives and links over TCP" $? "$(head -1 "$out/check-$per.txt")"
    done
    # Slurm before the faults: a host whose link is down answers no ping of slurmctld's, and
    # a node marked not responding refuses jobs until a later ping finds it (a CI run's
    # `srun -N4` after the link-down check: "Required node not available", then revoked).
    wanted slurm && slurm_checks "$rl" "$out"
    wanted slow_link && slow_link "$rl" "$out"
    wanted killed_rank && killed_rank "$rl" "$out"
    wanted link_down && link_down "$rl" "$out"
    wanted loaded_host && loaded_host "$rl" "$out"
    trap - EXIT INT TERM
    down >/dev/null 2>&1
    local left
    left=$(ip netns list 2>/dev/null | grep -c "^$prefix" || true)
    # No process that named the state folder (munged, slurmctld, slurmd, a rank) either.
    local procs
    procs=$(pgrep -f "$state" | grep -cv "^$$\$" || true)
    [ "$left" = 0 ] && [ "$procs" = 0 ] && ! ip link show "$bridge" >/dev/null 2>&1 && [ ! -e "$state" ] && [ ! -e "$cg" ]
    check "nothing left behind" $? "$left namespaces, $procs processes, no bridge, no $state, no $cg"
    echo "$passed passed, $failed failed"
    [ "$failed" = 0 ]
}

case ${1:-} in
    up) need_root; shift; up "${1:-4}" ;;
    down) need_root; down ;;
    run) need_root; shift; [ $# -ge 2 ] || { echo "run: HOST CMD..." >&2; exit 2; }; run_on "$@" ;;
    mpi) need_root; shift; [ $# -ge 3 ] || { echo "mpi: PER_HOST HOSTS CMD..." >&2; exit 2; }; mpi "$@" ;;
    slurm) need_root; shift; [ $# -ge 2 ] || { echo "slurm: HOST CMD..." >&2; exit 2; }; slurm "$@" ;;
    test) need_root; shift; run_test "$@" ;;
    *) echo "usage: scripts/cluster.sh up [N] | down | run HOST CMD... | mpi PER HOSTS CMD... | slurm HOST CMD... | test [CHECK...]" >&2; exit 2 ;;
esac
