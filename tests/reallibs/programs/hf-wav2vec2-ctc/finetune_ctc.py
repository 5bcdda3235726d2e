"""Speech recognition: a tiny Wav2Vec2ForCTC fine-tuned with its processor (a CTC tokenizer
from a local vocab.json and a feature extractor) on synthetic clips written with soundfile."""

import json

import numpy as np
import soundfile as sf
import torch
from transformers import (
    Wav2Vec2Config,
    Wav2Vec2CTCTokenizer,
    Wav2Vec2FeatureExtractor,
    Wav2Vec2ForCTC,
    Wav2Vec2Processor,
)

chars = list("abcdefghijklmnopqrstuvwxyz'")
vocab = {"<pad>": 0, "<unk>": 1, "|": 2, **{c: i + 3 for i, c in enumerate(chars)}}
with open("vocab.json", "w") as f:
    json.dump(vocab, f)
tokenizer = Wav2Vec2CTCTokenizer("vocab.json", unk_token="<unk>", pad_token="<pad>",
                                 word_delimiter_token="|")
extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0,
                                     do_normalize=True, return_attention_mask=True)
processor = Wav2Vec2Processor(feature_extractor=extractor, tokenizer=tokenizer)

rng = np.random.default_rng(0)
texts = ["hello world", "tiny speech", "hi", "ctc loss"]
for i in range(len(texts)):
    sf.write(f"clip{i}.wav", rng.uniform(-0.5, 0.5, 8000 + 1600 * i).astype(np.float32), 16000)

config = Wav2Vec2Config(
    hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
    conv_dim=(32, 32), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
    ctc_loss_reduction="mean",
)
model = Wav2Vec2ForCTC(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    audio = [sf.read(f"clip{i}.wav", dtype="float32")[0] for i in range(len(texts))]
    batch = processor(audio=audio, sampling_rate=16000, padding=True, return_tensors="pt")
    labels = processor(text=texts, padding=True, return_tensors="pt")
    label_ids = labels.input_ids.masked_fill(labels.attention_mask.ne(1), -100)
    loss = model(batch.input_values, attention_mask=batch.attention_mask, labels=label_ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.3f}")
