#!/bin/bash
# usage: slurm-node CONTROLLER NODE...
# Start this container as a SLURM node: write slurm.conf for the nodes named (container name
# = host name = SLURM NodeName; the first one also runs slurmctld), start munged, slurmctld
# on the controller, slurmd, then follow the daemons' logs (the container's log).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: slurm-node CONTROLLER NODE..." >&2; exit 2; }
controller=$1
shift
nodes=$(IFS=,; echo "$*")
me=$(hostname)

# CPUs as this container sees them: a node configured with more would be drained.
cat >/etc/slurm/slurm.conf <<CONF
# Written by slurm-node at start (tests/slurm/start.sh).
ClusterName=multinode
SlurmctldHost=$controller
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MinJobAge=600
NodeName=$nodes CPUs=$(nproc) State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

runuser -u munge -- munged
if [ "$me" = "$controller" ]; then
  slurmctld
fi
slurmd
logs=(/var/log/slurm/slurmd.log)
if [ "$me" = "$controller" ]; then logs+=(/var/log/slurm/slurmctld.log); fi
echo "slurm-node: $me up (controller $controller, nodes $nodes, $(nproc) CPUs)"
exec tail -n +1 -F "${logs[@]}"
