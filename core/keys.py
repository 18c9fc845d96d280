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

# Which tensor columns run along which axis, for padding rollouts of different widths to one
# (core/rollout_batch.py): P prompt positions (left-padded), T response positions (right-padded).
PROMPT_COLUMNS = (PROMPTS,)  # (B, P)
SEQUENCE_COLUMNS = (INPUT_IDS, ATTENTION_MASK, POSITION_IDS)  # (B, P + T)
RESPONSE_COLUMNS = (
    RESPONSES, RESPONSE_MASK, ROLLOUT_LOG_PROBS, OLD_LOG_PROBS, REF_LOG_PROBS, ENTROPY, VALUES, TOKEN_LEVEL_SCORES,
    TOKEN_LEVEL_REWARDS, ADVANTAGES, RETURNS, SUM_PI_SQUARED, ROLLOUT_IS_WEIGHTS, ROLLOUT_VERSIONS,
)  # (B, T)

# What the workers' registered methods read (``@register(reads=...)``): the driver ships only these.
FORWARD_INPUTS = (*SEQUENCE_COLUMNS, RESPONSES, RESPONSE_MASK)  # a teacher-forced pass over prompt + response
ACTOR_UPDATE_INPUTS = (
    *FORWARD_INPUTS, OLD_LOG_PROBS, ADVANTAGES, REF_LOG_PROBS, ROLLOUT_IS_WEIGHTS, ROLLOUT_LOG_PROBS,
)  # the last three only when present (KL loss, rollout correction, the update's log-prob gap)
CRITIC_UPDATE_INPUTS = (*FORWARD_INPUTS, VALUES, RETURNS)

# Non-tensor columns (DataProto.non_tensor_batch)
UID = "uid"  # (B,) one id per prompt, shared by its n samples
DATA_SOURCE = "data_source"  # (B,) which dataset / verifier a row comes from
GROUND_TRUTH = "ground_truth"  # (B,) reference answer for the verifier
EXTRA_INFO = "extra_info"  # (B,) dict of anything else the verifier needs
RAW_PROMPT = "raw_prompt"  # (B,) the prompt as loaded: chat messages (list of dicts) or text
PROMPT_TEXT = "prompt_text"  # (B,) the prompt as the policy reads it: rendered by its chat template
RM_INPUTS = (*FORWARD_INPUTS, RAW_PROMPT)  # the reward model: the tokens, or the messages it re-renders in its own template

# meta_info keys
METRICS = "metrics"  # dict of metric name -> value (lists after concat)
WEIGHT_SYNC_PREFIX = "weight_sync/"  # metrics of a weight push into the rollout (seconds, bytes), reported with its batch
