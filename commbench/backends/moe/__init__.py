"""The MoE dispatch/combine engines: the moe benchmark's exchange on a backend's own
tensors, one module per engine.

  torch_normal        normal mode, flat (DeepEP normal, Megatron's all-to-all): gloo on CPU
                      tensors, nccl on CUDA tensors, the same code; the rows and reductions
                      the other torch engines build on
  torch_low_latency   low-latency mode (DeepEP's decode kernels): fixed slots, no host sync
  torch_hierarchical  two tiers, across nodes then inside one (DeepEP internode)
  jax_normal          normal mode over jax.lax.ragged_all_to_all
  torch_allgather     Megatron's all-gather dispatcher: all_gather, select, reduce_scatter
  deepep_adapter      DeepEP's Buffer (normal and low-latency kernels), CUDA only
  pplx_adapter        pplx-kernels' AllToAll, CUDA only
  gpu_lib             what the two library adapters share (why_not, inputs, checks)

They sit together, apart from the communicators, because they are one job (moving routed
rows, stage by stage) on top of the collectives the communicators offer: a comm knows
nothing of MoE, and the benchmark picks the engine for the comm it runs on
(benchmarks/moe/engines.py). Importing this package imports neither torch nor jax.
"""
