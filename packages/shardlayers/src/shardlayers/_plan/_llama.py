"""A ready plan for Llama-family models (Hugging Face ``LlamaForCausalLM`` and its relatives:
Mistral, Qwen2, ... share the module names)."""

from __future__ import annotations


def llama_plan(
    *, sequence_parallel: bool = False, prefix: str = "model.", lm_head: str | None = "lm_head"
) -> dict[str, str]:
    """The tensor-parallel plan of a Llama-family causal LM.

    Attention and MLP in Megatron's layout (q/k/v and gate/up column-parallel, o/down
    row-parallel), the embedding and the LM head split along the vocabulary (the loss is computed
    on the split logits), and with ``sequence_parallel`` the norms run on sequence chunks.

    Parameters
    ----------
    sequence_parallel : bool
        Also split the residual stream along the sequence (the norms' activations are not
        replicated). With Hugging Face models pass ``input_ids`` (the positions of the whole
        sequence are then supplied), no padding ``attention_mask`` and ``use_cache=False``.
    prefix : str
        Name of the decoder inside the model (``"model."`` for ``LlamaForCausalLM``, ``""`` for
        ``LlamaModel``).
    lm_head : str or None
        Name of the LM head (None: no head, e.g. ``LlamaModel``).

    Returns
    -------
    dict
        Module pattern -> style, for :func:`shardlayers.parallelize_module`.
    """
    layers = f"{prefix}layers.*"
    plan = {
        f"{prefix}embed_tokens": "vocab",
        f"{layers}.self_attn.q_proj": "colwise",
        f"{layers}.self_attn.k_proj": "colwise",
        f"{layers}.self_attn.v_proj": "colwise",
        f"{layers}.self_attn.o_proj": "rowwise",
        f"{layers}.mlp.gate_proj": "colwise",
        f"{layers}.mlp.up_proj": "colwise",
        f"{layers}.mlp.down_proj": "rowwise",
    }
    if lm_head is not None:
        plan[lm_head] = "vocab_head"
    if sequence_parallel:
        # attention reshapes by its input's shape: it must see the whole sequence (the MLP's
        # projections gather their shared input themselves)
        plan[f"{layers}.self_attn"] = "sequence_gather"
        plan[f"{layers}.input_layernorm"] = "sequence"
        plan[f"{layers}.post_attention_layernorm"] = "sequence"
        plan[f"{prefix}norm"] = "sequence"
    return plan
