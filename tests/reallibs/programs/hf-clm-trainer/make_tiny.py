"""Tiny local inputs for train_clm.py, made offline: a text file, a byte-level BPE tokenizer
trained on it and a randomly initialised 1-layer GPT-2 config, saved to tiny-gpt2/."""

import random

from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Config, PreTrainedTokenizerFast

random.seed(0)
words = "the a speech model text tiny train token loss step data batch word line".split()
lines = [" ".join(random.choice(words) for _ in range(12)) for _ in range(64)]
with open("train.txt", "w") as f:
    f.write("\n".join(lines) + "\n")

bpe = ByteLevelBPETokenizer()
bpe.train_from_iterator(lines, vocab_size=300, min_frequency=1,
                        special_tokens=["<|endoftext|>"])
tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>",
                                    eos_token="<|endoftext|>", unk_token="<|endoftext|>",
                                    model_max_length=64)
tokenizer.save_pretrained("tiny-gpt2")
config = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=len(tokenizer),
                    bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
config.save_pretrained("tiny-gpt2")
