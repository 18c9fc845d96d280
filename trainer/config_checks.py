"""Check a composed config before anything starts (no Ray, no model load).

Every problem names the key, the value and what is allowed; all problems are
reported at once, so a user fixes a config in one pass. Where the rules live:

* a section's own fields: its dataclass's ``problems()`` in ``configs/schema.py``;
* sizes that must divide over the ranks: :class:`hybridflow.core.parallel_dims.ParallelDims`;
* here: rules that span sections, ask the plugin manager (estimator, loss,
  verifier names and their options' names and types), or look at the machine
  (paths, data files, checkpoints, GPUs, CPUs for the ranks, the server's address).

:func:`dataset_rows` loads the data files (still before Ray): one that is not
parquet, has no rows or lacks a column is an error naming its key there, and
:func:`check_datasets` then refuses a train batch larger than the training set.
"""

from __future__ import annotations

import ast
import dataclasses
import errno
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hybridflow.configs.roles import RolloutPlacement, installed_rollout_engine, needs_critic, rollout_placement
from hybridflow.core.devices import busy_cores, cpu_threads_per_rank, resolve_device
from hybridflow.core.parallel_dims import ParallelDims
from hybridflow.core.resource_pool import DEFAULT_CPUS_PER_CPU_BUNDLE
from hybridflow.core.storage import filesystem, is_url
from hybridflow.data.loading import REQUIRED_COLUMNS, DatasetError, load_rows
from hybridflow.losses import KL_PENALTIES, LOSS_AGG_MODES
from hybridflow.plugins import (
    UnknownNameError,
    get_agent_loop,
    get_estimator,
    get_policy_loss,
    get_reward_verifier,
    get_rollout_engine,
    get_tool,
)
from hybridflow.plugins.options import option_problems
from hybridflow.trainer.batch_hooks import hook_problems
from hybridflow.trainer.estimator_inputs import input_problems
from hybridflow.trainer.tracking import SINKS
from hybridflow.workers.rollout.tp_plan import tp_size_problems

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """One or more invalid settings; the message lists each with its key."""


DATA_FILES = (
    f"parquet files with rows in veRL's schema (columns {', '.join(REQUIRED_COLUMNS)}; "
    "python -m hybridflow.data.preprocess writes them)"
)
"""What ``data.train_files`` and ``data.val_files`` take, as the messages say it."""


def section_problems(node: Any, prefix: str = "") -> Iterator[str]:
    """Every section's own ``problems()``, each message prefixed with the section's dotted path."""
    if hasattr(node, "problems"):
        yield from (f"{prefix}.{message}" if prefix else message for message in node.problems())
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from section_problems(value, f"{prefix}.{f.name}" if prefix else f.name)


def _plugin_problems(cfg: Any) -> Iterator[str]:
    """Names the plugin manager must know, and what the estimator asks of the rest of the config."""
    algo, actor, rollout = cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    yield from hook_problems(list(algo.batch_hooks), dict(algo.batch_hook_options))
    try:
        loss = get_policy_loss(actor.policy_loss)
    except UnknownNameError as err:
        yield f"actor_rollout_ref.actor.policy_loss: {err}"
    else:
        yield from option_problems(
            "actor_rollout_ref.actor.policy_loss_options",
            actor.policy_loss_options,
            loss.options,
            f"policy loss {actor.policy_loss!r}",
        )
    try:
        estimator = get_estimator(algo.adv_estimator)
    except UnknownNameError as err:
        yield f"algorithm.adv_estimator: {err}"
        return
    yield from option_problems(
        "algorithm.estimator_options", algo.estimator_options, estimator.options, f"estimator {algo.adv_estimator!r}"
    )
    if estimator.needs_groups and rollout.n < 2:
        yield (
            f"actor_rollout_ref.rollout.n={rollout.n}: estimator {algo.adv_estimator!r} compares the responses "
            "of one prompt and needs n >= 2"
        )
    if estimator.needs_critic and cfg.critic.enable is False:
        yield f"critic.enable=False but estimator {algo.adv_estimator!r} needs a critic (set it to null or true)"
    yield from input_problems(estimator, cfg)
    yield from _agent_problems(rollout)


def _agent_problems(rollout: Any) -> Iterator[str]:
    """The agent loop and its tools are installed; its options are its own."""
    key = "actor_rollout_ref.rollout"
    for name in rollout.agent.tools:
        try:
            get_tool(name)
        except UnknownNameError as err:
            yield f"{key}.agent.tools: {err}"
    try:
        loop = get_agent_loop(rollout.agent_loop)
    except UnknownNameError as err:
        yield f"{key}.agent_loop: {err}"
        return
    yield from option_problems(
        f"{key}.agent.options", rollout.agent.options, loop.options, f"agent loop {rollout.agent_loop!r}"
    )
    if loop.single_generate and rollout.mode == "server":
        yield (
            f"{key}.mode=server serves agent loops, but {rollout.agent_loop!r} is one generation per prompt "
            "(set rollout.agent_loop to a multi-turn loop, or mode=direct)"
        )


def _custom_function_problems(custom: Any) -> Iterator[str]:
    """``reward.custom_reward_function``: its file exists, parses and defines the function it names. Read, not
    run: the file runs in the reward workers, and a missing one would otherwise score every sample as an error."""
    if not custom.path:
        return
    key, path = "reward.custom_reward_function.path", os.path.abspath(os.path.expanduser(custom.path))
    if not os.path.isfile(path):
        yield f"{key}={custom.path!r}: no such file ({path}); it names a Python file defining {custom.name}()"
        return
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    except (SyntaxError, UnicodeDecodeError, OSError) as err:
        yield f"{key}={custom.path!r}: not a readable Python file ({err})"
        return
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    if custom.name not in {*defined, *assigned, *imported}:
        yield (
            f"reward.custom_reward_function.name={custom.name!r}: {path} defines no such function; it defines: "
            f"{', '.join(defined) or '(no function)'}"
        )


def _reward_problems(reward: Any, response_length: int) -> Iterator[str]:
    """Routes that parse and name installed verifiers; an overlong zone that fits in the response."""
    from hybridflow.rewards.routing import Router

    try:
        Router(reward.route, dataclasses.asdict(reward.custom_reward_function), reward.verifier_kwargs)
    except (TypeError, ValueError) as err:
        yield f"reward.route: {err}"
        return
    yield from _custom_function_problems(reward.custom_reward_function)
    named = {f"reward.route[{key!r}]": target for key, target in reward.route.items()}
    named.update({f"reward.verifier_kwargs[{name!r}]": name for name in reward.verifier_kwargs})
    for key, target in named.items():
        for name in [target] if isinstance(target, str) else list(target):
            try:
                get_reward_verifier(name)
            except UnknownNameError as err:
                yield f"{key}: {err}"
    buffer = reward.overlong_buffer
    if buffer.enable and buffer.len >= response_length:
        yield (
            f"reward.overlong_buffer.len={buffer.len} must be < actor_rollout_ref.rollout.response_length="
            f"{response_length} (the penalty zone sits inside the response budget)"
        )


def _reward_model_problems(reward: Any, reward_model: Any) -> Iterator[str]:
    """A reward-model source needs the worker; an enabled worker that no source uses is a mistake; the model's
    directory is read only by the workers, so its absence is reported here, before Ray starts."""
    if "reward_model" in reward.sources and not reward_model.enable:
        yield (
            "reward.sources has reward_model but reward_model.enable=false: set reward_model.enable=true and "
            "reward_model.model.path, or drop the source"
        )
    if reward_model.enable and reward.sources and "reward_model" not in reward.sources:
        yield (
            f"reward_model.enable=true but reward.sources ({', '.join(reward.sources)}) does not use it: add "
            "reward.sources.reward_model or set reward_model.enable=false"
        )
    path = reward_model.model.path
    if reward_model.enable and path and not os.path.isdir(path):
        yield (
            f"reward_model.model.path={path!r} is not a directory; give a local HF model directory (an "
            "AutoModelForSequenceClassification with one label: hybridflow-train-rm writes one)"
        )


def _resume_problems(trainer: Any) -> Iterator[str]:
    from hybridflow.trainer.checkpoint import is_checkpoint

    local_dir = str(trainer.default_local_dir)
    if is_url(local_dir) and (problem := _filesystem_problem(local_dir)):
        yield f"trainer.default_local_dir={local_dir!r}: {problem}"
    mode = str(trainer.resume_mode)
    if mode in ("auto", "disable"):
        return
    if problem := _filesystem_problem(mode):
        yield f"trainer.resume_mode={mode!r}: {problem}"
        return
    fs, path = filesystem(mode)
    if not fs.isdir(path):
        yield f"trainer.resume_mode={mode!r}; allowed: auto, disable, or an existing checkpoint directory"
    elif not is_checkpoint(mode):
        yield (
            f"trainer.resume_mode={mode!r} is a directory but not a checkpoint (expected .../global_step_<N> "
            "holding driver.json); allowed: auto, disable, or such a directory"
        )


def _filesystem_problem(location: str) -> str | None:
    """Why fsspec cannot open ``location`` here (an unknown protocol, or its package missing), or None."""
    try:
        filesystem(location)
    except (ImportError, ValueError) as err:
        return f"no filesystem for it here ({str(err).splitlines()[0]}); for s3:// install hybridflow[s3]"
    return None


def _device_problems(config: Any) -> Iterator[str]:
    """GPUs asked for where the workers run on this machine; the rollout engine is installed and can run under
    the config (its own check: a vLLM build for the device, a model its kernels run)."""
    trainer, rollout = config.trainer, config.actor_rollout_ref.rollout
    if trainer.device == "cuda" and not (trainer.ray_address or os.environ.get("RAY_ADDRESS")):
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < trainer.n_gpus_per_node:
            yield (
                f"trainer.device='cuda' with trainer.n_gpus_per_node={trainer.n_gpus_per_node}, but this machine has "
                f"{found} GPU(s); use trainer=cpu (trainer.device=cpu), or a smaller trainer.n_gpus_per_node"
            )
    try:
        engine = get_rollout_engine(rollout.name)
    except UnknownNameError as err:
        yield f"actor_rollout_ref.rollout.name: {err}"
        return
    yield from engine.problems(config)


def _model_problems(cfg: Any) -> Iterator[str]:
    """The model path exists; tensor-parallel sizes split the model's heads (reads only its config)."""
    arr = cfg.actor_rollout_ref
    if not arr.model.path:
        return  # ModelConfig.problems says so
    path = str(arr.model.path)
    if not path.startswith("builtin:") and not os.path.isdir(path):
        yield (
            f"actor_rollout_ref.model.path={path!r} is not a directory; "
            "give a local HF model directory or builtin:<name>"
        )
        return
    yield from tp_size_problems(
        path, {"actor_rollout_ref.actor.tensor_model_parallel_size": arr.actor.tensor_model_parallel_size}
    )


def _lora_problems(arr: Any) -> Iterator[str]:
    """LoRA's limits: FSDP2 data parallelism only, an adapter directory that holds an adapter."""
    model = arr.model
    if not model.lora_rank:
        return
    if arr.actor.tensor_model_parallel_size > 1:
        yield (
            f"actor_rollout_ref.model.lora_rank={model.lora_rank} with actor.tensor_model_parallel_size="
            f"{arr.actor.tensor_model_parallel_size}: LoRA trains under FSDP2 data parallelism only; set "
            "actor.tensor_model_parallel_size=1 (the rollout may still use tensor parallelism)"
        )
    path = model.lora_adapter_path
    if path and not os.path.isfile(os.path.join(str(path), "adapter_config.json")):
        yield (
            f"actor_rollout_ref.model.lora_adapter_path={str(path)!r} holds no adapter_config.json; give a peft "
            "adapter directory (what `hybridflow export --adapter` writes)"
        )


def _placement_problems(cfg: Any) -> Iterator[str]:
    """The pipelined rollout modes need the rollout on ranks of its own, and what split placement supports."""
    trainer, rollout = cfg.trainer, cfg.actor_rollout_ref.rollout
    if trainer.rollout_mode != "sync" and trainer.placement != "split":
        yield (
            f"trainer.rollout_mode={trainer.rollout_mode!r} overlaps generation with training and needs the rollout "
            "on ranks of its own: set trainer.placement=split (and trainer.rollout_ranks), or trainer.rollout_mode=sync"
        )
    if trainer.placement != "split":
        return
    if trainer.rollout_mode != "sync" and not _single_generate(rollout.agent_loop):
        yield (
            f"trainer.rollout_mode={trainer.rollout_mode!r} streams single generations; the agent loop "
            f"{rollout.agent_loop!r} runs with trainer.rollout_mode=sync"
        )


def _server_placement_problems(cfg: Any) -> Iterator[str]:
    """An engine's own server process as the rollout (vLLM's ``vllm serve``): the agent loops are its clients."""
    trainer, rollout = cfg.trainer, cfg.actor_rollout_ref.rollout
    if rollout_placement(cfg) is not RolloutPlacement.SERVER:
        return
    if _single_generate(rollout.agent_loop):
        yield (
            f"actor_rollout_ref.rollout.mode='server' with {rollout.name!r} serves multi-turn agent loops; the agent "
            f"loop {rollout.agent_loop!r} generates in one batched call: set actor_rollout_ref.rollout.agent_loop="
            "tool_calling (experiment=tool_use), or actor_rollout_ref.rollout.mode=direct"
        )
    if trainer.placement != "colocated" or trainer.rollout_mode != "sync":
        yield (
            f"actor_rollout_ref.rollout.mode='server' with {rollout.name!r} runs the rollout in its own server process "
            f"beside the training ranks: trainer.placement={trainer.placement!r} and trainer.rollout_mode="
            f"{trainer.rollout_mode!r} must be colocated and sync"
        )


def _capacity_problems(trainer: Any) -> Iterator[str]:
    """The ranks fit the local Ray instance this run starts (no ``trainer.ray_address`` / ``RAY_ADDRESS``).

    Each rank is one bundle (``core/resource_pool.py``): a quarter CPU with ``trainer.device=cpu``, one CPU and
    one GPU with ``cuda``; the training pool and the rollout's (``trainer.placement=split``) are held at once, on the
    CPUs Ray finds on this machine. A cluster's room is checked as the pools are placed (``trainer/main.py``).
    """
    if trainer.ray_address or os.environ.get("RAY_ADDRESS") or trainer.nnodes != 1:
        return  # nnodes > 1 needs a cluster: the pool names the nodes it did not find
    cuda = trainer.device == "cuda"
    per_rank = 1.0 if cuda else DEFAULT_CPUS_PER_CPU_BUNDLE
    train, rollout = trainer.n_gpus_per_node, trainer.rollout_ranks if trainer.placement == "split" else 0
    gpus = _gpu_count() if cuda else 0
    if cuda and gpus < train:
        return  # fewer GPUs than training ranks: _device_problems says so
    cpus = _local_cpus()
    room = int(cpus / per_rank)
    asked = f"{train + rollout} ranks of {per_rank:g} CPU each (trainer.device={trainer.device!r})"
    join = "or join a Ray cluster that has room (trainer.ray_address)"
    if rollout and train <= room < train + rollout:
        yield (
            f"trainer.rollout_ranks={rollout} with trainer.placement=split beside trainer.n_gpus_per_node={train} "
            f"training ranks asks for {asked}, but this machine has {cpus} CPUs: at most {room - train} rollout "
            f"ranks beside them; lower trainer.rollout_ranks, {join}"
        )
    elif train + rollout > room:
        ranks, keys = f"trainer.n_gpus_per_node={train} training ranks", "trainer.n_gpus_per_node"
        if rollout:
            ranks, keys = f"{ranks} + trainer.rollout_ranks={rollout}", f"{keys} and trainer.rollout_ranks"
        yield (
            f"{ranks} ask for {asked}, but this machine has {cpus} CPUs: at most {room} ranks in all; "
            f"lower {keys}, {join}"
        )
    if cuda and gpus < train + rollout:
        yield (
            f"trainer.rollout_ranks={rollout} with trainer.placement=split needs {rollout} GPUs beside the "
            f"{train} of trainer.n_gpus_per_node, but this machine has {gpus}: at most {gpus - train} rollout "
            f"ranks; lower trainer.rollout_ranks, {join}"
        )


def _gpu_count() -> int:
    """The GPUs torch sees on this machine."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _server_problems(cfg: Any) -> Iterator[str]:
    """``rollout.mode=server``: this machine can listen on ``rollout.server.host``:``port``, where the driver starts
    the server (``agents/server.py``, or ``vllm serve`` with ``name=vllm``). Tried by binding a socket (with
    ``SO_REUSEADDR``, as both servers do) to each address the host resolves to, and closing it."""
    rollout = cfg.actor_rollout_ref.rollout
    server, key = rollout.server, "actor_rollout_ref.rollout.server"
    if rollout.mode != "server" or (rollout_placement(cfg) is RolloutPlacement.SERVER and server.url):
        return  # server.url: an engine server of the user's (a vllm serve), not bound here
    local = (
        "use a local address: 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or an address of one of "
        "its interfaces"
    )
    try:
        infos = socket.getaddrinfo(server.host, server.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as err:
        yield f"{key}.host={server.host!r} is not an address this machine resolves ({err}); {local}"
        return
    for family, kind, proto, _, address in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as err:
                yield _bind_problem(key, server, address[0], err, local)
                return


def _bind_problem(key: str, server: Any, address: str, err: OSError, local: str) -> str:
    """The message for a server address this machine cannot listen on, by what bind said."""
    free = "use a free port, or 0 to let the server pick one (the URL is logged)"
    if err.errno == errno.EADDRINUSE:
        return f"{key}.port={server.port}: port {server.port} on {address} is in use ({err.strerror}); {free}"
    if err.errno == errno.EACCES:
        return f"{key}.port={server.port}: listening on it needs privileges ({err.strerror}); {free} (above 1023)"
    if err.errno == errno.EADDRNOTAVAIL:
        return f"{key}.host={server.host!r} is not an address of this machine ({err.strerror}); {local}"
    return f"{key}.host={server.host!r}, {key}.port={server.port}: cannot listen there ({err}); {local}, and {free}"


def _single_generate(loop: str) -> bool:
    try:
        return get_agent_loop(loop).single_generate
    except UnknownNameError:
        return True  # _agent_problems names it


def _name_problems(cfg: Any) -> Iterator[str]:
    actor, trainer = cfg.actor_rollout_ref.actor, cfg.trainer
    if actor.loss_agg_mode is not None and actor.loss_agg_mode not in LOSS_AGG_MODES:
        yield (
            f"actor_rollout_ref.actor.loss_agg_mode={actor.loss_agg_mode!r}; "
            f"allowed: {', '.join(LOSS_AGG_MODES)}, or null"
        )
    if cfg.critic.loss_agg_mode not in LOSS_AGG_MODES:
        yield f"critic.loss_agg_mode={cfg.critic.loss_agg_mode!r}; allowed: {', '.join(LOSS_AGG_MODES)}"
    for key, value in (
        ("actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type),
        ("algorithm.kl_penalty", cfg.algorithm.kl_penalty),
    ):
        if value not in KL_PENALTIES:
            yield f"{key}={value!r}; allowed: {', '.join(KL_PENALTIES)}"
    unknown_loggers = [name for name in trainer.logger if name not in SINKS]
    if unknown_loggers:
        yield f"trainer.logger has {unknown_loggers}; allowed: {', '.join(SINKS)}"


def _bypass_problems(cfg: Any) -> Iterator[str]:
    """Bypass mode computes veRL's own policy loss (``losses/bypass.py``): a configured other one would be ignored."""
    corr, loss = cfg.algorithm.rollout_correction, cfg.actor_rollout_ref.actor.policy_loss
    if corr.bypass_mode and loss != "vanilla":
        yield (
            f"algorithm.rollout_correction.bypass_mode=true computes its own policy loss (loss_type={corr.loss_type}: "
            "the vanilla PPO clip against the rollout's log-probs, or REINFORCE), so actor_rollout_ref.actor."
            f"policy_loss={loss!r} would be ignored: set it to vanilla, or bypass_mode=false"
        )


def settle_device(trainer: Any) -> None:
    """``trainer.device=auto`` made ``cpu`` or ``cuda`` in place (``core/devices.py``), with a line saying which:
    everything checked or built from the config after this sees the device the run takes."""
    device, why = resolve_device(trainer.device)
    if why:
        trainer.device = device
        logger.info(why)


def settle_cpu_threads(trainer: Any) -> None:
    """``trainer.cpu_threads_per_rank=null`` (auto) made a number in place for a CPU run, with a line saying why
    (``core/devices.py``): from the CPUs free on this machine for a local Ray instance, 1 on a joined cluster.
    Called once, where a run is built and before Ray starts (its own start-up would read as busy CPUs)."""
    if trainer.device != "cpu" or trainer.cpu_threads_per_rank is not None:
        return
    if trainer.ray_address or os.environ.get("RAY_ADDRESS"):
        trainer.cpu_threads_per_rank = 1
        logger.info("trainer.cpu_threads_per_rank=auto: 1 (a joined cluster's nodes are not measured from here)")
        return
    ranks = trainer.n_gpus_per_node + (trainer.rollout_ranks if trainer.placement == "split" else 0)
    omp = os.environ.get("OMP_NUM_THREADS", "")
    threads, why = cpu_threads_per_rank(_local_cpus(), ranks, busy_cores, int(omp) if omp.isdigit() else None)
    trainer.cpu_threads_per_rank = threads
    logger.info(why)


def _local_cpus() -> int:
    """This machine's CPUs as a local Ray instance will count them (cgroup limits included)."""
    try:  # Ray is not started here: only its count of this machine's CPUs
        from ray._private.utils import get_num_cpus  # Ray's own count: cgroup limits included
    except ImportError:  # a Ray that moved it
        return len(os.sched_getaffinity(0))
    return get_num_cpus()


def config_problems(cfg: Any, *, this_machine: bool = True) -> list[str]:
    """Every invalid setting of ``cfg`` (a PPOConfig or its DictConfig), one message each; a PPOConfig's
    ``trainer.device=auto`` is settled first (:func:`settle_device`). ``this_machine=False`` leaves out what only
    the machine that runs it can say (its CPUs, GPUs and engine builds): ``hybridflow plan`` plans a GPU run here."""
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_object(cfg)
    settle_device(cfg.trainer)
    problems = list(section_problems(cfg))
    problems += _plugin_problems(cfg)
    problems += _name_problems(cfg)
    problems += _bypass_problems(cfg)
    problems += _placement_problems(cfg)
    problems += _lora_problems(cfg.actor_rollout_ref)
    problems += _server_placement_problems(cfg)
    problems += _server_problems(cfg)
    problems += _capacity_problems(cfg.trainer) if this_machine else []
    use_critic = not any(p.startswith("algorithm.adv_estimator:") for p in problems) and needs_critic(cfg)
    dims = ParallelDims.from_config(cfg, use_critic=use_critic)
    problems += dims.problems()
    problems += _reward_problems(cfg.reward, cfg.actor_rollout_ref.rollout.response_length)
    problems += _reward_model_problems(cfg.reward, cfg.reward_model)
    problems += _resume_problems(cfg.trainer)
    problems += _device_problems(cfg) if this_machine else []
    if not any(p.startswith("trainer.nnodes") or "tensor_model_parallel_size" in p for p in problems):
        problems += _model_problems(cfg)
    return problems


def config_warnings(cfg: Any) -> list[str]:
    """Valid but probably unintended settings, one message each (the run goes on)."""
    arr = cfg.actor_rollout_ref
    path = str(arr.model.path or "")
    out = []
    corr = cfg.algorithm.rollout_correction
    ratio_corrects = corr.bypass_mode and corr.loss_type == "ppo_clip"  # the PPO ratio is against pi_rollout
    if cfg.trainer.rollout_mode != "sync" and corr.rollout_is is None and not ratio_corrects:
        out.append(
            f"trainer.rollout_mode={cfg.trainer.rollout_mode!r} trains on samples from older weights without a "
            "correction: set algorithm.rollout_correction.rollout_is=token (truncated importance weights)"
        )
    if path and not path.startswith("builtin:") and arr.rollout.response_length <= 16:
        out.append(
            f"actor_rollout_ref.model.path={path!r} is a real checkpoint, but the job keeps the builtin toy's "
            f"settings (rollout.response_length={arr.rollout.response_length}, actor lr "
            f"{arr.actor.optim.lr:g}): use experiment=gsm8k_grpo or set them for your model"
        )
    engine = installed_rollout_engine(cfg)
    out += engine.warnings(cfg) if engine is not None else []
    return out


def check_config(cfg: Any) -> None:
    """Raise :class:`ConfigError` listing every invalid setting of ``cfg`` (see :func:`config_problems`)."""
    problems = config_problems(cfg)
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))


def dataset_rows(data: Any, train_files: list[str], val_files: list[str]) -> tuple[list[dict], list[dict]]:
    """The validated rows of the training and validation files as :func:`~hybridflow.trainer.main.resolve_data_files`
    gave them (:func:`hybridflow.data.loading.load_rows`; files given for both are read once).

    Raises :class:`ConfigError` when a file is refused (missing, zero bytes, not parquet, no rows, a column
    missing or mistyped, a null), naming its key (``data.val_files`` when set, else ``data.train_files``,
    whose files stand in for it), the file and what is wrong, for both at once. (Run where the rows load,
    before Ray: documented commands name data files that only the reader has, and the config check passes them.)
    """
    sets = {
        "train": ("data.train_files", train_files),
        "val": ("data.val_files" if data.val_files else "data.train_files", val_files),
    }
    rows: dict[str, list[dict]] = {}
    problems = []
    for split, (key, files) in sets.items():
        if split == "val" and files == train_files:
            rows["val"] = rows.get("train", [])
            continue
        try:
            rows[split] = load_rows(files)[0]
        except (DatasetError, OSError) as err:
            problems.append(f"{key}: {err}; allowed: {DATA_FILES}")
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))
    return rows["train"], rows["val"]


def check_datasets(cfg: Any, train_prompts: int, val_prompts: int, files: dict[str, list[str]]) -> None:
    """Raise :class:`ConfigError` when the loaded prompt sets cannot fill a step (before Ray starts).

    ``train_prompts`` / ``val_prompts`` count what is left after over-long prompts were dropped;
    ``files`` names the files each came from (``{"train": [...], "val": [...]}``).
    """
    problems = []
    batch = cfg.data.train_batch_size
    if train_prompts < batch:
        problems.append(
            f"data.train_batch_size={batch} is larger than the {train_prompts} training prompts left after dropping "
            f"those over data.max_prompt_length={cfg.data.max_prompt_length} tokens "
            f"({', '.join(map(_short, files['train']))}); "
            f"allowed: at most {train_prompts}"
        )
    if val_prompts < 1 and cfg.trainer.test_freq > 0:
        problems.append(
            f"data.val_files ({', '.join(map(_short, files['val']))}) have no prompts within "
            f"data.max_prompt_length={cfg.data.max_prompt_length}; set trainer.test_freq=0 to train without validation"
        )
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))


def _short(path: str) -> str:
    return Path(path).name
