"""Job shapes against a cluster's nodes (stillroom/plan/fit.py), from `scontrol show node -o` text:
a shape no node of its partition holds is refused in one line naming the rule, what it asks and
what the partition's largest node has."""

from stillroom.plan.fit import job_shape, parse_nodes, refusals

# two nodes of the test cluster (scripts/slurm-up.sh) and one bigger CPU-only node
SCONTROL = """\
NodeName=sr1 Arch=x86_64 CPUTot=2 Gres=gpu:2 RealMemory=2000000 State=IDLE Partitions=cpu,gpu
NodeName=sr2 Arch=x86_64 CPUTot=2 Gres=gpu:h100:2(S:0) RealMemory=2000000 Partitions=cpu,gpu
NodeName=big Arch=x86_64 CPUTot=64 Gres=(null) RealMemory=512000 State=IDLE Partitions=cpu
"""


def test_nodes_are_read_with_their_gpus_and_partitions():
    sr1, sr2, big = parse_nodes(SCONTROL)
    assert (sr1.cpus, sr1.mem_mb, sr1.gpus, sr1.partitions) == (2, 2000000, 2, ("cpu", "gpu"))
    assert sr2.gpus == 2 and (big.gpus, big.cpus) == (0, 64)


def test_a_shape_no_node_holds_is_refused_in_one_line():
    nodes = parse_nodes(SCONTROL)
    # the big node holds it
    pool = job_shape("pool", 8, {"slurm_partition": "cpu", "mem_mb": 32000})
    train = job_shape(
        "train",
        64,
        {"slurm_partition": "gpu", "mem_mb": 1000000, "gpu": 4, "nodes": 1},
    )
    wide = job_shape(
        "train",
        2,
        {"slurm_partition": "gpu", "mem_mb": 8000, "nodes": 3, "tasks": 3, "gres": "gpu:1"},
    )
    assert refusals([pool], nodes) == []
    assert refusals([train, train, wide], nodes) == [
        "rule train asks 64 CPUs, 1000000 MB, 4 GPUs per node on 1 node(s); partition gpu's "
        "largest node (sr1) has 2 CPUs, 2000000 MB, 2 GPUs (2 node(s))",
        "rule train asks 2 CPUs, 8000 MB, 1 GPUs per node on 3 node(s); partition gpu's "
        "largest node (sr1) has 2 CPUs, 2000000 MB, 2 GPUs (2 node(s))",
    ]
    missing = job_shape("tables", 1, {"slurm_partition": "nope"})
    assert refusals([missing], nodes) == ["rule tables: partition 'nope' has no nodes (scontrol)"]


def test_mpi_jobs_ask_per_node_cpus_for_their_tasks():
    shape = job_shape("train", 4, {"slurm_partition": "gpu", "nodes": 2, "tasks": 4})
    assert (shape.cpus, shape.nodes) == (8, 2)
