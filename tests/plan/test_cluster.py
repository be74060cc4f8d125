"""The job shape of each GPU stage, as the (resolved) config fixes it: GPUs per teacher server,
nodes and GPUs per node of the training layout, GPUs of the evaluation backend."""

import yaml

from stillroom.config import resolve
from stillroom.plan.cluster import backend_gpus, stage_gpus, train_resources

from ..conftest import REPO, default_config

DISTILL = REPO / "config" / "experiments" / "beam-distill.yaml"
SERVE = "python -m sglang.launch_server --port {port}"  # a server command (required)


def test_job_shapes_follow_the_config():
    assert backend_gpus({"backend": "sglang", "server": {"command": SERVE, "tp": 2}}) == 2
    assert backend_gpus({"backend": "sglang", "server": {"command": SERVE, "tp": 4, "dp": 2}}) == 8
    assert (
        backend_gpus({"backend": "sglang", "server": {"command": SERVE, "tp": 4, "gpus": 2}}) == 2
    )
    # no backend configured: the checkpoint in the job's own process, on one GPU
    unset = resolve(default_config(), root=REPO)["eval"]["backend"]
    assert backend_gpus({"backend": "hf"}) == 1 and backend_gpus(unset) == 1
    assert backend_gpus({"backend": "openai"}) == backend_gpus({"backend": "procedural"}) == 0
    assert train_resources({"train": {}}) == {"gpu": 1, "nodes": 1}
    assert train_resources({"train": {"distributed": {"nodes": 2, "gpus_per_node": 8}}}) == {
        "nodes": 2,
        "tasks": 2,
        "gres": "gpu:8",
        "mpi": "srun",
    }
    # The cost ledger charges the same shapes when sacct has no answer.
    assert stage_gpus(resolve(yaml.safe_load(DISTILL.read_text()), root=REPO)) == {
        "generate": 2,
        "train": 4,
        "train-efforts": 8,  # the seed's second phase on a whole node
        "evaluate": 1,
        "evaluate_budget": 1,
        "evaluate_effort": 1,
    }


def test_each_teacher_s_generation_jobs_are_charged_its_own_gpus():
    """The API answers medium, the self-hosted server the grouped efforts: the cost ledger's
    fallback charges each teacher's generation jobs its GPUs (generate-<teacher> for another than
    generation.teacher)."""
    cfg = yaml.safe_load(DISTILL.read_text())
    cfg["generation"].update(
        teacher="beam-api",
        effort_teachers={"low": "beam-sglang", "high": "beam-sglang", "xhigh": "beam-sglang"},
    )
    gpus = stage_gpus(resolve(cfg, root=REPO))
    assert gpus["generate"] == 0 and gpus["generate-beam-sglang"] == 2


def test_a_training_phase_with_its_own_layout_gets_its_own_job_shape():
    cfg = resolve(yaml.safe_load(DISTILL.read_text()), root=REPO)
    assert train_resources(cfg, phase=0) == {"gpu": 4, "nodes": 1}
    assert train_resources(cfg, phase=1) == {"gpu": 8, "nodes": 1}
    cfg["train"]["phases"][1]["distributed"] = {"nodes": 2, "gpus_per_node": 8}
    assert train_resources(cfg, phase=1) == {
        "nodes": 2,
        "tasks": 2,
        "gres": "gpu:8",
        "mpi": "srun",
    }
    assert stage_gpus(cfg)["train-efforts"] == 16 and stage_gpus(cfg)["train"] == 4
