"""Names of the batch columns, defined once.

Every stage reads and writes these keys of a :class:`~hybridflow.core.DataProto`;
importing the constant instead of retyping the string makes a typo an
``ImportError`` rather than a silent ``KeyError`` three stages later.
Shapes use B for rows (prompt x sample) and T for response tokens.
"""

# Tensor columns (DataProto.batch)
PROMPTS = "prompts"  # (B, P) left-padded prompt token ids
RESPONSES = "responses"  # (B, T) generated token ids, right-padded
INPUT_IDS = "input_ids"  # (B, P + T) prompt followed by response
ATTENTION_MASK = "attention_mask"  # (B, P + T) 1 for real tokens
POSITION_IDS = "position_ids"  # (B, P + T)
RESPONSE_MASK = "response_mask"  # (B, T) 1 for response tokens that count
ROLLOUT_LOG_PROBS = "rollout_log_probs"  # (B, T) log-probs from the rollout engine
ROLLOUT_VERSIONS = "rollout_versions"  # (B, T) long: weight version whose forward sampled each token (a stream)
OLD_LOG_PROBS = "old_log_probs"  # (B, T) recomputed under the training layout
REF_LOG_PROBS = "ref_log_probs"  # (B, T) reference policy log-probs
ENTROPY = "entropy"  # (B, T) policy entropy at each response position
VALUES = "values"  # (B, T) critic values
TOKEN_LEVEL_SCORES = "token_level_scores"  # (B, T) verifier score at the last token
TOKEN_LEVEL_REWARDS = "token_level_rewards"  # (B, T) scores after any KL penalty
ADVANTAGES = "advantages"  # (B, T) float32
RETURNS = "returns"  # (B, T) float32
# Tensor columns that only some estimators and losses read (each declares it; see
# plugins/entries.py); the driver fills them because of the declaration.
REWARD_BASELINES = "reward_baselines"  # (B,) score of a greedy response to the row's prompt (ReMax)
REWARD_COMPONENTS = "reward_components"  # (B, K) one score per reward component, K fixed for the run (GDPO)
SUM_PI_SQUARED = "sum_pi_squared"  # (B, T) sum over the vocabulary of pi(v)^2 at each response position
ROLLOUT_IS_WEIGHTS = "rollout_is_weights"  # (B, T) rollout -> training importance weights, no gradient
RM_SCORES = "rm_scores"  # (B,) float32 the reward model's score of each row's prompt + response (veRL's name)
REWARD_FAILED = "reward_failed"  # (B,) bool: no reward could be computed (a verifier timed out or raised)

# Which tensor columns run along which axis, for padding rollouts of different widths to one
# (core/rollout_batch.py): P prompt positions (left-padded), T response positions (right-padded).
PROMPT_COLUMNS = (PROMPTS,)  # (B, P)
SEQUENCE_COLUMNS = (INPUT_IDS, ATTENTION_MASK, POSITION_IDS)  # (B, P + T)
RESPONSE_COLUMNS = (
    RESPONSES,
    RESPONSE_MASK,
    ROLLOUT_LOG_PROBS,
    OLD_LOG_PROBS,
    REF_LOG_PROBS,
    ENTROPY,
    VALUES,
    TOKEN_LEVEL_SCORES,
    TOKEN_LEVEL_REWARDS,
    ADVANTAGES,
    RETURNS,
    SUM_PI_SQUARED,
    ROLLOUT_IS_WEIGHTS,
    ROLLOUT_VERSIONS,
)  # (B, T)

# What the workers' registered methods read (``@register(reads=...)``): the driver ships only these.
# Each tuple is what the method's code reads of its batch (a column it never touches is not shipped); generation
# reads SEQUENCE_COLUMNS (``position_ids`` when present), ONE_TO_ALL methods without a batch declare ``reads=()``.
LOG_PROB_INPUTS = (*SEQUENCE_COLUMNS, RESPONSES)  # a teacher-forced pass over prompt + response (log-probs: old, ref)
FORWARD_INPUTS = (*LOG_PROB_INPUTS, RESPONSE_MASK)  # the same pass, masked to the response (the critic's values)
ACTOR_UPDATE_INPUTS = (
    *FORWARD_INPUTS,
    OLD_LOG_PROBS,
    ADVANTAGES,
    REF_LOG_PROBS,
    ROLLOUT_IS_WEIGHTS,
    ROLLOUT_LOG_PROBS,
)  # the last three only when present (KL loss, rollout correction, the update's log-prob gap)
CRITIC_UPDATE_INPUTS = (*FORWARD_INPUTS, VALUES, RETURNS)

# Non-tensor columns (DataProto.non_tensor_batch)
UID = "uid"  # (B,) one id per prompt, shared by its n samples
DATA_SOURCE = "data_source"  # (B,) which dataset / verifier a row comes from
GROUND_TRUTH = "ground_truth"  # (B,) reference answer for the verifier
EXTRA_INFO = "extra_info"  # (B,) dict of anything else the verifier needs
RAW_PROMPT = "raw_prompt"  # (B,) the prompt as loaded: chat messages (list of dicts) or text
PROMPT_TEXT = "prompt_text"  # (B,) the prompt as the policy reads it: rendered by its chat template
PROMPT_ID = "prompt_id"  # (B,) int: the prompt's row in its dataset as loaded (its stable id across runs)
EPOCH = "epoch"  # (B,) int: the pass over the training prompts the row was drawn in (0 first)
# the reward model: the tokens (no positions: it re-pads its own rows), or the messages it re-renders in its template
RM_INPUTS = (INPUT_IDS, ATTENTION_MASK, RESPONSES, RESPONSE_MASK, RAW_PROMPT)

# meta_info keys: every key that crosses the driver/worker boundary is one of these (tests/core/test_boundary_keys.py
# fails on a raw string key in agents/, trainer/, workers/, core/). The group ships a call's whole meta_info.
METRICS = "metrics"  # dict of metric name -> value (lists after concat)
WEIGHT_SYNC_PREFIX = (
    "weight_sync/"  # metrics of a weight push into the rollout (seconds, bytes), reported with its batch
)

# ... of a generation call (prompts in, rollout out)
N_SAMPLES = "n"
"""int: responses per prompt row. Written by the driver (``PPOTrainer.draw_prompts``, ``validate``,
``greedy_baseline``) and by ``GenerationBatcher`` (1 per turn); read by ``generate_sequences`` /
``generate_stream``, ``AgentRunner.run`` and ``with_prompt_columns`` (which repeat the prompts' columns n times)."""
GREEDY = "greedy"
"""bool: argmax decoding instead of sampling. Written with :data:`N_SAMPLES`; read by ``generate_sequences`` and
``AgentRollout.generate`` (its clients decode so)."""
SEED = "seed"
"""int: the call's sampling seed (each rollout dp rank offsets it, ``call_seed``). Written with :data:`N_SAMPLES`
(from ``trainer.seed`` and the rollout batch index); read by ``generate_sequences`` / ``generate_stream`` and
``AgentRollout.generate``; leaves the rollout batch (``trainer/rollout_modes.py CALL_KEYS``)."""
MAX_NEW_TOKENS = "max_new_tokens"
"""int, optional: at most this many tokens (within ``rollout.response_length``, the default). Written by
``GenerationBatcher`` (an agent loop's turn); read by ``sampling_for`` in ``generate_sequences``."""
STOP_TOKEN_IDS = "stop_token_ids"
"""list[int], optional: token ids that end a response besides EOS. Written by ``GenerationBatcher``; read by
``generate_sequences``."""
STREAM_REQUEST = "request"
"""int: the id of one pipelined rollout request (its rollout batch index, which is also the weight version the trainer
holds when it takes the batch: a ``batch`` swap to that version waits for it). Written by ``PipelinedRollout``; read
by ``RolloutWorker.generate_stream``; leaves the rollout batch with :data:`SEED`."""
WEIGHT_VERSION = "weight_version"
"""int: the policy's weight version the rollout sampled with (the actor's count of updates). Written on the
rollout's output by ``generate_sequences`` (actor and rollout workers), ``AgentRunner.run`` (the oldest of its
turns), ``AgentRollout`` (vLLM's server) and ``engine_generate_fn`` (0); read by ``check_version`` /
``staleness`` on the driver and by ``GenerationBatcher``."""

# ... of a training-batch call (driver to the workers)
WITH_SUM_PI_SQUARED = "with_sum_pi_squared"
"""bool: ``compute_log_prob`` also returns :data:`SUM_PI_SQUARED` (an estimator declared it). Written by
``PPOTrainer.old_log_probs``; read by ``ActorRolloutWorker.compute_log_prob``."""
GLOBAL_STEP = "global_step"
"""int: the driver's step count, which seeds the update's row shuffle (a resumed run shuffles alike). Written by
``PPOTrainer.train_step``; read by ``ActorRolloutWorker.update_actor``."""
