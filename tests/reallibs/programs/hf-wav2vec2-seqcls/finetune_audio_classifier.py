"""Audio classification (no text target): a tiny Wav2Vec2ForSequenceClassification
fine-tuned on synthetic clips written and read back with soundfile."""

import numpy as np
import soundfile as sf
import torch
from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2ForSequenceClassification

rng = np.random.default_rng(0)
paths = []
for i in range(4):
    path = f"clip{i}.wav"
    sf.write(path, rng.uniform(-0.5, 0.5, 8000 + 800 * i).astype(np.float32), 16000)
    paths.append(path)
labels = torch.tensor([0, 1, 0, 1])

extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0,
                                     do_normalize=True, return_attention_mask=True)
config = Wav2Vec2Config(
    hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
    conv_dim=(32, 32), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2, num_labels=2, classifier_proj_size=16,
)
model = Wav2Vec2ForSequenceClassification(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    audio = [sf.read(p, dtype="float32")[0] for p in paths]
    batch = extractor(audio, sampling_rate=16000, padding=True, return_tensors="pt")
    loss = model(**batch, labels=labels).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.3f}")
