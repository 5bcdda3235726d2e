"""Causal language-model training the way transformers' examples/pytorch/language-modeling/
run_clm.py does it (written for these tests; the example itself is not on the package
index): HfArgumentParser dataclasses, the causal-LM model table, AutoConfig, AutoTokenizer,
AutoModelForCausalLM, a `text` dataset from datasets, grouped blocks, Trainer. Text only."""

import sys
from dataclasses import dataclass, field
from itertools import chain

import datasets
import evaluate  # noqa: F401  (run_clm imports it for its eval metric)
import torch
import transformers
from transformers import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)


@dataclass
class ModelArguments:
    config_name: str = field(default="tiny-gpt2")
    tokenizer_name: str = field(default="tiny-gpt2")


@dataclass
class DataArguments:
    train_file: str = field(default="train.txt")
    block_size: int = field(default=32)


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    set_seed(training_args.seed)
    assert len(MODEL_FOR_CAUSAL_LM_MAPPING) > 0  # the table run_clm lists its model types from
    raw = datasets.load_dataset("text", data_files={"train": data_args.train_file})
    config = AutoConfig.from_pretrained(model_args.config_name)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    tokenized = raw.map(lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"])
    size = data_args.block_size

    def group(examples: dict) -> dict:
        joined = {k: list(chain(*examples[k])) for k in examples}
        total = len(joined["input_ids"]) // size * size
        out = {k: [t[i : i + size] for i in range(0, total, size)] for k, t in joined.items()}
        out["labels"] = out["input_ids"].copy()
        return out

    lm = tokenized.map(group, batched=True)
    trainer = Trainer(model=model, args=training_args, train_dataset=lm["train"],
                      data_collator=default_data_collator)
    trainer.train()
    print("transformers", transformers.__version__, "steps", trainer.state.global_step,
          file=sys.stderr)


if __name__ == "__main__":
    main()
