import sys, specllm
draft = sys.argv[1] if len(sys.argv) > 1 else "ngram"
llm = specllm.LLM("qwen2.5-coder-1.5b", draft=None if draft == "none" else draft, n_threads=2)
p = llm.profile
if p:
    print({k: v for k, v in p.items() if k != "verify_costs"})
    print("T(n):", [round(x) for x in p.get("verify_costs", [])])
prompt = "Explain in detail how a hash map works, with its collision handling and resizing."
for i in range(3):
    r = llm.generate(prompt, max_tokens=64, ignore_eos=True)
    print(draft, i, round(r.stats.tokens_per_second, 2) if hasattr(r.stats, "tokens_per_second") else r.stats, flush=True)
