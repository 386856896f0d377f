"""Data-parallel DP-SGD runs on ``torch.distributed``: ``dpcl run CONFIG --nproc N`` and ``torchrun ... dpcl run``.

For a task whose data or model outgrows one device. Every rank holds the
stream and trains the same model; each DP-SGD step's Poisson batch is drawn
once (by rank 0) and split across the ranks, and opacus'
``DistributedDPOptimizer`` adds the Gaussian noise once, on rank 0, to the
sum of all ranks' clipped gradients
(:func:`dpcl.methods.dpsgd_training._train_data_parallel`). The mechanism is
the single-process one, so the plan, the ledger charges and every epsilon are
the same as a single-process run's.

Roles:

* **rank 0** runs :func:`dpcl.runner.run.run_training` unchanged: it audits the
  config, charges the ledger, trains its shard, writes checkpoints, curator
  state, certificates, ``run.json`` and metrics, and evaluates. Only rank 0
  writes anything.
* **ranks > 0** (:func:`_follow`) rebuild the same stream and plans from the
  config and call the method's ``fit_task`` for the same tasks; their
  ``train_classifier`` calls join rank 0's. They read the resume point from
  ``run.json`` before joining any collective (rank 0 cannot finish a training
  call, hence cannot write ``run.json``, before every rank joined its header),
  write nothing, and stop when rank 0 says the run ended.

Failure: the ledger is charged before a task trains and every file is written
atomically, so a rank that dies leaves the run directory as an interrupted
single-process run would (the task in progress stays charged, nothing of it is
released); rank 0 reports :class:`~dpcl.errors.DistributedRunError` and a
rerun with the same ``--out`` and ``--resume`` resumes after the last certified task (with any
``--nproc``: the process count is not part of the run's identity).

Backends: ``gloo`` on the CPU, ``nccl`` on CUDA (rank ``r`` uses
``cuda:LOCAL_RANK``). ``--nproc`` spawns the ranks on this machine (the
calling process is rank 0); under ``torchrun`` (``WORLD_SIZE`` > 1 in the
environment) the process group comes from its environment, across machines
too, provided every rank reads the same config, data and ``--out`` (shared
file system only for the resume point).

Why no library launcher: ``torch.multiprocessing`` spawns the ranks and
``torch.distributed`` connects them; what remains here is dpcl's own protocol
(who writes, which tasks the other ranks train, how they stop).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

from dpcl._io.atomic_io import read_json
from dpcl.data import STREAM_KEYS
from dpcl.errors import ConfigError, DistributedRunError, InvalidParameterError
from dpcl.audit_config import resolve_across_tasks
from dpcl.guarantees.config import load_config
from dpcl.guarantees.method_registry import REGISTRY
from dpcl.methods.base import method_class
from dpcl.runner.run import resolve_device, run_training
from dpcl.runner.tasks import (
    build_run_stream,
    label_sets,
    method_setup,
    prepare_tasks,
    release_data,
    run_options,
    task_plan,
)
from dpcl.runner.threads import usable_cores

#: How long a rank waits in a collective (e.g. for rank 0 to certify a release) before giving up.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


def launched_by_torchrun() -> bool:
    """True when this process is one rank of a ``torchrun`` (or other ``env://``) launch with more than one rank."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def run_training_options(*, seed: int, quiet: bool, stop_after_task: int | None, reproducible_noise: bool,
                         sign_key: Any, resume: bool = False) -> dict[str, Any]:
    """The keyword arguments rank 0 passes to :func:`~dpcl.runner.run.run_training` (besides the device)."""
    return {"seed": seed, "quiet": quiet, "stop_after_task": stop_after_task,
            "reproducible_noise": reproducible_noise, "sign_key": sign_key, "resume": resume}




def check_nproc(nproc: Any, name: str = "nproc") -> int:
    """The number of local ranks: an integer from 1 to one rank per usable CPU core, or per CUDA device where there
    are more of those (each rank is a process holding its own copy of the model and data: more of them than the
    machine runs at once only slow the run down, and a huge count would start processes until memory runs out).
    Anything else is refused before a process starts; ``name`` is how the caller spells the parameter."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise InvalidParameterError(f"{name} must be an integer >= 1, got {nproc!r:.40}.")
    cores = usable_cores()
    if nproc > cores:
        import torch

        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        largest = max(cores, devices)
        if nproc > largest:
            raise InvalidParameterError(
                f"{name} must be at most {largest}, got {min(nproc, 10**300):.3g}; this machine has {cores} usable CPU cores and "
                f"{devices} CUDA devices, one rank each; use more machines under torchrun for more ranks."
            )
    return nproc


def _check_config(config_path: "str | Path", device: str | None, world: int) -> tuple[str, str]:
    """The method must train by DP-SGD; returns (backend, base device) for ``world`` ranks."""
    config = load_config(Path(config_path), data_stream_keys=STREAM_KEYS)
    name = config.method["name"]
    if not getattr(config.spec, "data_parallel", False):
        ready = [n for n in REGISTRY.names() if getattr(REGISTRY.spec(n), "data_parallel", False)]
        raise ConfigError(
            f"data-parallel training (--nproc > 1 or torchrun) runs DP-SGD methods only ({', '.join(ready)}: their "
            f"specs say data_parallel); method {name!r} runs in one process: drop --nproc."
        )
    base = resolve_device(device, config.method)
    if base.startswith("cuda:"):
        raise InvalidParameterError(
            f"with more than one process the device must be 'cpu' or 'cuda' (rank r uses cuda:LOCAL_RANK), got "
            f"{base!r}; select GPUs with CUDA_VISIBLE_DEVICES instead."
        )
    if base == "cuda":
        import torch

        if torch.cuda.device_count() < world:
            raise InvalidParameterError(
                f"{world} processes on cuda need {world} CUDA devices, this machine has {torch.cuda.device_count()}; "
                "lower --nproc, or use --device cpu."
            )
    return ("nccl" if base == "cuda" else "gloo"), base


def _rank_device(base: str, local_rank: int) -> str:
    if base == "cuda":
        import torch

        torch.cuda.set_device(local_rank)
        return f"cuda:{local_rank}"
    return "cpu"


def _share_cpu_threads(world: int) -> int:
    """Give each rank its share of the CPU cores (oversubscribed threads slow DP-SGD's small kernels down)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, usable_cores() // world))
    return before


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- rank 0 -------------------------------------------------------------------------------------------------------
def _lead(config_path: Any, out_dir: Any, *, device: str, run_options: dict[str, Any]) -> Any:
    """Rank 0: the ordinary run, then the end-of-run word to the other ranks (also when it fails)."""
    import torch.distributed as dist

    # lazy import: imports torch; keeps it out of CLI start-up and a run's config checks
    from dpcl.methods.dpsgd_training import end_data_parallel_run

    ok = False
    try:
        result = run_training(config_path, out_dir, device=device, **run_options)
        ok = True
        return result
    except (RuntimeError, dist.DistError) as exc:
        if not isinstance(exc, dist.DistError) and "gloo" not in str(exc).lower() and "nccl" not in str(exc).lower():
            raise
        raise DistributedRunError(
            f"a rank of the data-parallel run failed ({str(exc).splitlines()[0][:200]}); every certified release "
            f"and every charge stay in {str(out_dir)!r}: rerun the same command with --resume to continue after the "
            "last certified task."
        ) from exc
    finally:
        try:
            end_data_parallel_run(ok, device)
        except (RuntimeError, dist.DistError):  # the other ranks are gone already
            pass


# -- ranks > 0 ----------------------------------------------------------------------------------------------------
def _resume_point(out: Path) -> int:
    """The first task rank 0 will train: one after the last release ``run.json`` records (0 for a new run)."""
    state_path = out / "run.json"
    if not state_path.exists():
        return 0
    try:
        releases = read_json(state_path).get("releases", [])
    except (OSError, ValueError):
        return 0  # rank 0 refuses the damaged file and ends the run; this rank then stops
    return int(releases[-1]["task_index"]) + 1 if releases else 0


def _follow(config_path: Any, out_dir: Any, *, device: str, seed: int, reproducible_noise: bool) -> bool:
    """A rank > 0: train the same tasks as rank 0 (its shards of them), write nothing, stop when rank 0 ends.

    It builds the stream, tasks, method and plans with the same public stages as rank 0
    (:mod:`dpcl.runner.tasks`), so that its training calls match rank 0's. Returns True when rank 0 finished
    the run without an error (then every rank meets at :func:`_meet_at_end`).
    """
    # lazy import: imports torch; keeps it out of CLI start-up and a run's config checks
    from dpcl.methods.dpsgd_training import DataParallelStop, wait_for_end_of_run

    # Read before this rank joins any collective: rank 0 cannot pass the header of its first training call (an
    # all_reduce) before every rank has joined it, so it writes no run.json before this read.
    start = _resume_point(Path(out_dir))
    try:
        config = load_config(Path(config_path), data_stream_keys=STREAM_KEYS)
        options = run_options(config)
        cls = method_class(config.method["name"])
        stream = build_run_stream(config, seed=seed, device=device)
        sets = label_sets(config, len(stream))
        prepared, _ = prepare_tasks(stream, sets, bool(getattr(cls, "needs_texts", False)))
        across, _ = resolve_across_tasks(config.settings.across_tasks, config.settings.disjoint_units)
        method = cls(method_setup(config, sets, prepared, across=across, seed=seed, device=device,
                                  reproducible_noise=bool(reproducible_noise or options["reproducible_noise"])))
        for t in range(start, len(prepared)):
            data, outputs, _ = release_data(prepared, t, config.spec.reuses_past_tasks)
            # data-parallel methods (spec.data_parallel) are DP-SGD methods whose plan covers the checkpoint: a private run trains the
            # plan, a non-private one the noise-free plan (dpcl.runner.tasks.trains_plan with covered = True)
            plan = task_plan(config, t, len(data), trains_plan=bool(options["private"]))
            method.fit_task(t, data, outputs, plan)  # the model is rank 0's (broadcast) at every call
        return wait_for_end_of_run(device)
    except DataParallelStop as stop:
        return not stop.failed


def _meet_at_end() -> None:
    """Every rank of a finished run waits here for the others before any of them leaves the process group.

    Without it the first rank to finish could tear its connections down while another still reads its
    last collective from them; the garbage collection then drops the data-parallel wrappers' references to
    the group, so that its threads are joined when the group is destroyed rather than during interpreter
    exit, where a gloo rank can abort ("terminate called without an active exception").
    """
    import gc

    import torch.distributed as dist

    try:
        dist.barrier()
    except (RuntimeError, dist.DistError):  # a rank gone after the run finished: nothing is left to wait for
        pass
    gc.collect()


def _spawned_rank(index: int, port: int, world: int, backend: str, base: str, config_path: str, out_dir: str,
                  seed: int, reproducible_noise: bool) -> None:
    """Entry point of a rank that ``--nproc`` spawned (rank = index + 1; the parent is rank 0)."""
    import torch.distributed as dist

    rank = index + 1
    _share_cpu_threads(world)
    device = _rank_device(base, rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=COLLECTIVE_TIMEOUT)
    try:
        if _follow(config_path, out_dir, device=device, seed=seed, reproducible_noise=reproducible_noise):
            _meet_at_end()
    finally:
        dist.destroy_process_group()


# -- entry points -------------------------------------------------------------------------------------------------
def run_data_parallel(
    config_path: "str | Path",
    out_dir: "str | Path",
    *,
    nproc: int,
    seed: int = 0,
    device: str | None = None,
    quiet: bool = False,
    stop_after_task: int | None = None,
    reproducible_noise: bool = False,
    sign_key: "str | Path | None" = None,
    resume: bool = False,
) -> Any:
    """``dpcl run --nproc N``: the run of :func:`~dpcl.runner.run.run_training` on ``nproc`` local processes.

    ``nproc = 1`` is the ordinary single-process run. Returns rank 0's
    :class:`~dpcl.runner.run.RunResult` (the same files, ledger and epsilons as
    a single-process run of the same config).
    """
    world = check_nproc(nproc)
    options = run_training_options(seed=seed, quiet=quiet, stop_after_task=stop_after_task,
                                   reproducible_noise=reproducible_noise, sign_key=sign_key, resume=resume)
    if world == 1:
        return run_training(config_path, out_dir, device=device, **options)
    if launched_by_torchrun():
        raise InvalidParameterError("--nproc starts its own processes; under torchrun leave --nproc out.")
    backend, base = _check_config(config_path, device, world)
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    port = _free_port()
    workers = mp.start_processes(
        _spawned_rank,
        args=(port, world, backend, base, str(config_path), str(out_dir), seed, reproducible_noise),
        nprocs=world - 1,
        join=False,
        start_method="spawn",
    )
    threads = _share_cpu_threads(world)
    initialised = False
    try:
        rank_device = _rank_device(base, 0)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=world,
                                timeout=COLLECTIVE_TIMEOUT)
        initialised = True
        result = _lead(config_path, out_dir, device=rank_device, run_options=options)
    except BaseException:
        _stop(workers)
        raise
    else:
        _meet_at_end()
        _join(workers)  # before the process group goes: this process hosts its store, which the ranks use to exit
        return result
    finally:
        if initialised:
            dist.destroy_process_group()
        torch.set_num_threads(threads)


def _join(workers: Any) -> None:
    """Wait for the spawned ranks to finish (rank 0 told them the run ended)."""
    import torch.multiprocessing as mp

    try:
        while not workers.join(timeout=60):
            pass
    except mp.ProcessRaisedException as exc:
        raise DistributedRunError(f"a rank of the data-parallel run failed: {str(exc).strip().splitlines()[-1]}") from None
    except mp.ProcessExitedException as exc:
        raise DistributedRunError(
            f"a rank of the data-parallel run died ({exc}); rerun the same command with --resume to continue."
        ) from None


def _stop(workers: Any, grace_seconds: float = 30.0) -> None:
    """Rank 0 failed: give the spawned ranks time to stop on its end-of-run word, then end those still running."""
    import time

    deadline = time.monotonic() + grace_seconds
    for process in workers.processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in workers.processes:
        if process.is_alive():
            process.terminate()  # one of the processes this call started, by its own handle
            process.join(timeout=10)


def run_under_torchrun(
    config_path: "str | Path",
    out_dir: "str | Path",
    *,
    seed: int = 0,
    device: str | None = None,
    quiet: bool = False,
    stop_after_task: int | None = None,
    reproducible_noise: bool = False,
    sign_key: "str | Path | None" = None,
    resume: bool = False,
) -> Any:
    """One rank of ``torchrun --nproc-per-node N -m dpcl run CONFIG --out DIR``: rank 0's RunResult, else None."""
    import torch.distributed as dist

    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    backend, base = _check_config(config_path, device, local_world)
    _share_cpu_threads(local_world)
    rank_device = _rank_device(base, local_rank)
    dist.init_process_group(backend, init_method="env://", timeout=COLLECTIVE_TIMEOUT)
    try:
        result = None
        if rank == 0:
            options = run_training_options(seed=seed, quiet=quiet, stop_after_task=stop_after_task,
                                           reproducible_noise=reproducible_noise, sign_key=sign_key, resume=resume)
            result = _lead(config_path, out_dir, device=rank_device, run_options=options)
            _meet_at_end()
        elif _follow(config_path, out_dir, device=rank_device, seed=seed, reproducible_noise=reproducible_noise):
            _meet_at_end()
        return result
    finally:
        dist.destroy_process_group()
