"""A byte-level BPE tokenizer trained on the toy corpus, saved as a Hugging Face tokenizer.

Byte-level, so any text round-trips (code, JSON, unicode) without an unknown token. The chat
template is Qwen's plain ChatML, so prompts render the way `morse_jax.llm.Tokenizer`
renders them for real Qwen checkpoints, and <|im_end|> is the EOS the sampler stops on.
"""

from __future__ import annotations

from typing import Iterable

PAD, IM_START, IM_END, EOT = "<pad>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END, EOT)  # ids 0..3, in this order
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def train_bpe(texts: Iterable[str], vocab_size: int, path: str | None = None):
  """Trains the BPE on `texts`; returns a transformers PreTrainedTokenizerFast, also saved to
  `path` (save_pretrained) when given. The vocabulary may come out smaller than `vocab_size`
  on a small corpus (BPE stops when no pair is left to merge)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  from transformers import PreTrainedTokenizerFast

  core = Tokenizer(models.BPE())
  core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  core.decoder = decoders.ByteLevel()
  # trim_offsets=False: keep offsets byte-exact; no BOS/EOS is added around plain encodes.
  core.post_processor = processors.ByteLevel(trim_offsets=False)
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  core.train_from_iterator(texts, trainer=trainer)
  tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=IM_END, pad_token=PAD,
                                additional_special_tokens=[IM_START, EOT])
  tok.chat_template = CHAT_TEMPLATE
  tok.model_max_length = 1 << 20  # no truncation warnings: the model's limit is in config.json
  if path is not None:
    tok.save_pretrained(path)
  return tok


def generation_config(tok) -> dict:
  """generation_config.json contents: stop on <|im_end|> and <|endoftext|>, pad with <pad>."""
  return {"eos_token_id": [tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(EOT)],
          "pad_token_id": tok.convert_tokens_to_ids(PAD)}
