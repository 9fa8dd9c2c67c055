#!/usr/bin/env python3
# Run where torch + transformers are installed, from the repo root, with OUT set and the Qwen3
# tokenizer in .fixturegen/qwen3tok (tools/fetch_tokenizers.sh).
# Greedy references for e2e cases whose prompt holds token id 0: generate() with
# pad_token_id=0 infers an attention mask that hides that token; give the mask explicitly.
import json, os, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
d = 'tests/data/e2e'
cases = json.load(open(os.path.join(d, 'e2e.json')))['cases']
tok = AutoTokenizer.from_pretrained('.fixturegen/qwen3tok')
m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
fix = []
for i, c in enumerate(cases):
    if 0 not in c['prompt_ids']:
        continue
    ids = torch.tensor([c['prompt_ids']])
    with torch.no_grad():
        g = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                       eos_token_id=None, pad_token_id=0)
    out = g[0, ids.shape[1]:].tolist()
    fix.append({'case': i, 'greedy_ids': out, 'greedy_text': tok.decode(out, skip_special_tokens=False),
                'why': 'the prompt holds token id 0; the shipped reference masked it out (pad_token_id=0)'})
json.dump({'note': 'made with transformers generate(attention_mask=ones), float32', 'cases': fix},
          open(os.environ['OUT'] + '/e2e_fixes.json', 'w'), indent=1, ensure_ascii=False)
print(json.dumps(fix, ensure_ascii=False)[:400])
