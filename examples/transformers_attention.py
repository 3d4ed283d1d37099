"""A transformers model on dispatch attention: register once, pass attn_implementation="dispatch".

Prefill logits and greedy ``generate`` are compared with the same weights on transformers' sdpa.
Run: python examples/transformers_attention.py   (CPU, a tiny random Llama; exit status 1 on a mismatch)
"""
import copy
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from dispatch.integrations.transformers import register


def main() -> int:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, vocab_size=512)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=register()).eval()  # the one line
    sdpa = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="sdpa").eval()  # own config:
    # from_config writes attn_implementation into the config it is given
    sdpa.load_state_dict(model.state_dict())
    ids = torch.randint(0, cfg.vocab_size, (2, 24))
    with torch.no_grad():
        err = (model(ids).logits - sdpa(ids).logits).abs().max().item()
        ours = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0)
        theirs = sdpa.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0)
    same = torch.equal(ours, theirs)
    print(f"prefill max |logit diff| vs sdpa: {err:.2e}; greedy generate identical: {same}")
    return 0 if same and err < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
