import torch

from bebop.model.checkpoint import build_model, save_model
from bebop.model.config import ModelConfig
from bebop.tokenizer import build_char_tokenizer, save_tokenizer

tok = build_char_tokenizer()
cfg = ModelConfig(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=64, max_position_embeddings=1024, eos_token_id=1, pad_token_id=0)
m = build_model(cfg)
m.attach_mtp(1, torch.Generator().manual_seed(0))
save_model(m, "/tmp/big")
save_tokenizer(tok, "/tmp/big")
