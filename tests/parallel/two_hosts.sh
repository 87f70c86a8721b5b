#!/usr/bin/env bash
# two_hosts.sh [--mpirun PATH] [--ranks-per-host N] [--keep-hostname] -- PROGRAM [ARGS...]
#
# Runs PROGRAM under OpenMPI's mpirun as if on two hosts: two network namespaces ("host A" 10.213.0.1
# and "host B" 10.213.0.2, each with its own loopback) joined by a veth pair, N ranks in each (default 1),
# every byte between the hosts over TCP on the veth link. mpirun runs in A; it starts its daemon (orted)
# on B through the rsh launcher, with a two-line agent in place of ssh that enters namespace B
# (`ip netns exec`) and, unless --keep-hostname, a UTS namespace with its own host name, so MPI sees two
# nodes (node-local rank 0 on each) without any sshd. Namespaces, the veth pair and the agent are
# removed on exit (trap), also when the program fails.
#
# Exit status: PROGRAM's (through mpirun); 77 when namespaces cannot be made here (not root, no `ip`,
# no CAP_SYS_ADMIN/CAP_NET_ADMIN, e.g. an unprivileged container), with the reason on one line
# (ctest SKIP_RETURN_CODE 77); 2 on bad arguments.
# Example (the 2-rank training run): tests/parallel/two_hosts.sh -- build/apps/pretrain_llama --device cpu ...
set -uo pipefail

mpirun=${MPIRUN:-mpirun} per_host=1 keep_hostname=0
while (($#)); do
  case $1 in
    --mpirun) mpirun=${2:?}; shift 2 ;;
    --ranks-per-host) per_host=${2:?}; shift 2 ;;
    --keep-hostname) keep_hostname=1; shift ;;
    --) shift; break ;;
    *) echo "two_hosts: unknown argument '$1' (two_hosts.sh [--mpirun PATH] [--ranks-per-host N] -- PROGRAM ...)" >&2
       exit 2 ;;
  esac
done
(($#)) || { echo "two_hosts: no program given (two_hosts.sh ... -- PROGRAM [ARGS...])" >&2; exit 2; }
[[ $per_host =~ ^[1-9][0-9]*$ ]] || { echo "two_hosts: --ranks-per-host takes a positive number" >&2; exit 2; }

skip() { echo "two_hosts: SKIPPED: $*" >&2; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "network namespaces need root (this is uid $(id -u))"
command -v ip >/dev/null 2>&1 || skip "the 'ip' command (iproute2) is not installed"
command -v "$mpirun" >/dev/null 2>&1 || skip "no mpirun ('$mpirun') to launch with"
if ((keep_hostname == 0)) && ! command -v unshare >/dev/null 2>&1; then keep_hostname=1; fi

# Names unique per run (veth names: at most 15 characters).
tag=$$
ns_a=pl2h_a_$tag ns_b=pl2h_b_$tag veth_a=pl2ha$tag veth_b=pl2hb$tag
work=$(mktemp -d "${TMPDIR:-/tmp}/two_hosts.XXXXXX")
cleanup() {
  ip netns del "$ns_a" 2>/dev/null  # deleting a namespace deletes its end of the veth pair, and the pair
  ip netns del "$ns_b" 2>/dev/null
  ip link del "$veth_a" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

err=$(ip netns add "$ns_a" 2>&1) || skip "cannot create a network namespace: $err"
err=$(ip netns add "$ns_b" 2>&1) || skip "cannot create a second network namespace: $err"
err=$(ip link add "$veth_a" type veth peer name "$veth_b" 2>&1) || skip "cannot create a veth pair: $err"
{ ip link set "$veth_a" netns "$ns_a" && ip link set "$veth_b" netns "$ns_b" &&
  ip -n "$ns_a" addr add 10.213.0.1/24 dev "$veth_a" && ip -n "$ns_b" addr add 10.213.0.2/24 dev "$veth_b" &&
  ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up &&
  ip -n "$ns_a" link set "$veth_a" up && ip -n "$ns_b" link set "$veth_b" up; } 2>"$work/ip.err" ||
  skip "cannot set up the veth link: $(tr '\n' ' ' <"$work/ip.err")"

# The "ssh" of host B. The rsh launcher calls it as `agent [options] HOST COMMAND...`, where COMMAND is
# one shell command line (as ssh would hand it to the remote shell).
cat >"$work/agent" <<EOF
#!/bin/sh
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done  # options meant for ssh
[ "\$1" = 10.213.0.2 ] || { echo "two_hosts agent: unknown host \$1" >&2; exit 255; }
shift
if [ $keep_hostname -eq 1 ]; then exec ip netns exec $ns_b sh -c "\$*"; fi
exec ip netns exec $ns_b unshare --uts sh -c "hostname two-hosts-b 2>/dev/null || echo two-hosts-b >/proc/sys/kernel/hostname; \$*"
EOF
chmod +x "$work/agent"

# Host A gets its own host name too (else both "hosts" would report this machine's name).
prefix=(ip netns exec "$ns_a")
((keep_hostname == 0)) && prefix+=(unshare --uts sh -c 'hostname two-hosts-a 2>/dev/null || echo two-hosts-a >/proc/sys/kernel/hostname; exec "$@"' sh)

np=$((2 * per_host))
echo "two_hosts: $np ranks, $per_host on 10.213.0.1 ($ns_a) and $per_host on 10.213.0.2 ($ns_b), TCP over veth"
# --mca plm rsh + plm_rsh_agent: start host B's daemon with the agent above (never ssh, never Slurm);
# btl self,tcp and pml ob1: TCP between ranks (no shared memory, no InfiniBand/UCX), and the TCP
# traffic (ranks and daemons) only on the veth link.
"${prefix[@]}" "$mpirun" --allow-run-as-root --oversubscribe --bind-to none \
  --mca plm rsh --mca plm_rsh_agent "$work/agent" \
  --host "10.213.0.1:$per_host,10.213.0.2:$per_host" -np "$np" --map-by slot \
  --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include 10.213.0.0/24 --mca oob_tcp_if_include 10.213.0.0/24 \
  "$@"
