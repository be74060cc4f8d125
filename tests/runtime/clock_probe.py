"""SaveClock's decision on every rank of a launcher job whose ranks' clocks disagree: rank 0 reads
59 s then 61 s since the last checkpoint, rank 1 the opposite (a clock read a little later, or a
rank that got to the step end later). test_launch spawns it on 2 gloo ranks."""


def probe(*, out_dir, threads, log):
    import torch.distributed as dist
    from transformers import TrainerState

    from stillroom.runtime.checkpoints import SaveClock

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    now = 0.0
    clock = SaveClock(1, clock=lambda: now)
    state = TrainerState(global_step=3, max_steps=10)
    answers = []
    for seconds in ((59.0, 61.0), (61.0, 59.0)):
        now = seconds[0] if rank == 0 else seconds[1]
        answers.append(clock.due(state, "cpu"))
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, answers)
    # every rank past its last collective before any tears gloo down
    dist.barrier()
    dist.destroy_process_group()
    return {"answers": every}


if __name__ == "__main__":
    # the entry point of the workers the tests spawn (stillroom.runtime.launch.spawn)
    from stillroom.runtime.launch import serve

    serve(probe)
