"""A text-only Trainer job: a tiny GPT-2 on an in-memory datasets.Dataset of random ids."""

import torch
from datasets import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.manual_seed(0)
config = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=128)
model = GPT2LMHeadModel(config)
ids = torch.randint(0, config.vocab_size, (8, 16)).tolist()
train = Dataset.from_dict({"input_ids": ids, "labels": ids})
args = TrainingArguments(
    output_dir="out",
    max_steps=2,
    per_device_train_batch_size=4,
    learning_rate=1e-3,
    report_to=[],
    save_strategy="no",
    logging_steps=1,
    use_cpu=True,
)
Trainer(model=model, args=args, train_dataset=train).train()
