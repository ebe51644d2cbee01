#!/bin/sh
# Launch agent of Open MPI / PRRTE on the distkit simulated cluster: a stand-in for
# `ssh HOST COMMAND...` (PRTE_MCA_plm_ssh_agent names it). It runs COMMAND (the
# remote daemon, prted) inside the simulated host's network namespace and in a UTS
# namespace whose hostname is HOST, as ssh would run it on that machine.
# The daemon inherits this environment (ssh would give it a fresh one); PRRTE passes
# what the daemon needs on its command line either way.
while [ $# -gt 0 ]; do
    case "$1" in
        -*) shift ;;  # ssh-style options (plm_ssh_args) mean nothing here
        *) break ;;
    esac
done
if [ $# -lt 2 ]; then
    echo "distkit cluster agent: usage: $0 HOST COMMAND..." >&2
    exit 255
fi
host=$1
shift
if [ ! -e "/run/netns/$host" ]; then
    echo "distkit cluster agent: no simulated host '$host' (is the cluster up?)" >&2
    exit 255
fi
# Like ssh, join the remaining words into one command line for the remote shell. Like the ssh
# client, this process stays on the launching side (in the root namespace) while the command runs,
# and when the command is killed by a signal it exits 255, as ssh does. PRRTE reads that as a lost
# daemon and fails the job; exec'ing into the host instead would let a killed host's daemon look
# to PRRTE like an ssh session that ended normally (exit status 0, job "succeeds").
ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$*"' "$host" "$@"
status=$?
if [ "$status" -gt 128 ]; then
    echo "distkit cluster agent: the command on $host was killed by signal $((status - 128)) (host $host lost)" >&2
    exit 255
fi
exit "$status"
