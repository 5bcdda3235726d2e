"""Speech recognition: a tiny WhisperForConditionalGeneration fine-tuned with a WhisperProcessor
built offline (a byte-level BPE WhisperTokenizer from local vocab.json and merges.txt, and a
feature extractor) on synthetic clips written with soundfile."""

import json

import numpy as np
import soundfile as sf
import torch
from transformers import (
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperProcessor,
    WhisperTokenizer,
)

# The byte-level alphabet of GPT-2/Whisper tokenizers (bytes_to_unicode), no merges.
printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
             *range(ord("®"), ord("ÿ") + 1)]
codes, n = list(printable), 0
for b in range(256):
    if b not in printable:
        printable.append(b)
        codes.append(256 + n)
        n += 1
alphabet = [chr(c) for c in codes]
specials = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|transcribe|>",
            "<|translate|>", "<|nocaptions|>", "<|notimestamps|>", "<|startofprev|>"]
vocab = {tok: i for i, tok in enumerate(alphabet + specials)}
with open("vocab.json", "w") as f:
    json.dump(vocab, f)
with open("merges.txt", "w") as f:
    f.write("#version: 0.2\n")
tokenizer = WhisperTokenizer("vocab.json", "merges.txt", unk_token="<|endoftext|>",
                             bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                             pad_token="<|endoftext|>")
extractor = WhisperFeatureExtractor(feature_size=16, sampling_rate=16000, chunk_length=1,
                                    n_fft=400, hop_length=160)
processor = WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer)

rng = np.random.default_rng(0)
texts = ["hello world", "tiny speech", "hi", "whisper"]
for i in range(len(texts)):
    sf.write(f"clip{i}.wav", rng.uniform(-0.5, 0.5, 8000 + 1600 * i).astype(np.float32), 16000)

sot = vocab["<|startoftranscript|>"]
config = WhisperConfig(
    vocab_size=len(vocab), num_mel_bins=16, d_model=32, encoder_layers=1, decoder_layers=1,
    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
    decoder_ffn_dim=64, max_source_positions=50, max_target_positions=64,
    pad_token_id=vocab["<|endoftext|>"], bos_token_id=vocab["<|endoftext|>"],
    eos_token_id=vocab["<|endoftext|>"], decoder_start_token_id=sot,
)
model = WhisperForConditionalGeneration(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    audio = [sf.read(f"clip{i}.wav", dtype="float32")[0] for i in range(len(texts))]
    features = processor(audio=audio, sampling_rate=16000, return_tensors="pt").input_features
    labels = processor.tokenizer(texts, padding=True, return_tensors="pt")
    label_ids = labels.input_ids.masked_fill(labels.attention_mask.ne(1), -100)
    loss = model(input_features=features, labels=label_ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.3f}")
