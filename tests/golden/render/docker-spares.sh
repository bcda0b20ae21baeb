# train: 2 machines + 1 spare x 8 GPUs started by hand, ghcr.io/example/multinode:1.0
# Rendered by: entrypoint render docker --nodes 2 --spares 1 --min-nodes 1 --gpus-per-node 8 --image ghcr.io/example/multinode:1.0 --master-addr 10.0.0.1 --env NCCL_DEBUG=INFO --env HF_TOKEN -- python train.py --epochs 3
# Run block i on machine i, in any order; node 0 waits for the others.
# Machine 0 is 10.0.0.1: the others reach it on TCP ports 29500 (rendezvous) and 29501
# (the entrypoints' own channel), so let them through its firewall.
# --network host and --ipc host: NCCL uses the machine's interfaces and shared memory
# (without --ipc host, give --shm-size=16g). With InfiniBand, add to each command:
#   --device /dev/infiniband
# the entrypoint then finds the HCAs in /sys/class/infiniband and sets NCCL_IB_HCA.
# Control token (only this job's machines can join node 0): export the same value on every machine first,
#   export ENTRYPOINT_JOB_TOKEN=<the output of `openssl rand -hex 32`, run once>
# When a node dies:
#   a standby (of 1) takes its rank and every node's trainer restarts from its last checkpoint;
#   with no standby left, the job restarts on the survivors while 1 or more are alive;
#   docker starts a failed node's container again, a standby then;
#   node 0's loss costs a restart: a survivor takes its seat (the job's own etcd, on 3 of its nodes);
#   node 0's container, started again, joins the new node 0 as a standby.
# Metrics: node 0 serves every node's health at http://10.0.0.1:29502/metrics. Live table: entrypoint status 10.0.0.1:29502; Prometheus: a static target.
# HF_TOKEN: secret, never written here: docker takes it from the shell (export it there first).

# Machine 0 (node 0, the master)
docker run --restart on-failure --name train-node0 \
    --gpus all --network host --ipc host \
    --ulimit memlock=-1 --ulimit stack=67108864 \
    -e NNODES=3 -e NODE_RANK=0 -e MASTER_ADDR=10.0.0.1 -e MASTER_PORT=29500 -e ENTRYPOINT_JOB_ID=train -e ENTRYPOINT_JOB_TOKEN -e GPUS_PER_NODE=8 \
    -e NCCL_DEBUG=INFO -e HF_TOKEN -e ENTRYPOINT_SPARES=1 -e ENTRYPOINT_MIN_NODES=1 \
    ghcr.io/example/multinode:1.0 run -- python train.py --epochs 3

# Machine 1 (node 1)
docker run --restart on-failure --name train-node1 \
    --gpus all --network host --ipc host \
    --ulimit memlock=-1 --ulimit stack=67108864 \
    -e NNODES=3 -e NODE_RANK=1 -e MASTER_ADDR=10.0.0.1 -e MASTER_PORT=29500 -e ENTRYPOINT_JOB_ID=train -e ENTRYPOINT_JOB_TOKEN -e GPUS_PER_NODE=8 \
    -e NCCL_DEBUG=INFO -e HF_TOKEN -e ENTRYPOINT_SPARES=1 -e ENTRYPOINT_MIN_NODES=1 \
    ghcr.io/example/multinode:1.0 run -- python train.py --epochs 3

# Machine 2 (node 2, a spare)
docker run --restart on-failure --name train-node2 \
    --gpus all --network host --ipc host \
    --ulimit memlock=-1 --ulimit stack=67108864 \
    -e NNODES=3 -e NODE_RANK=2 -e MASTER_ADDR=10.0.0.1 -e MASTER_PORT=29500 -e ENTRYPOINT_JOB_ID=train -e ENTRYPOINT_JOB_TOKEN -e GPUS_PER_NODE=8 \
    -e NCCL_DEBUG=INFO -e HF_TOKEN -e ENTRYPOINT_SPARES=1 -e ENTRYPOINT_MIN_NODES=1 \
    ghcr.io/example/multinode:1.0 run -- python train.py --epochs 3
