"""The moe benchmark's jax engine on a host whose XLA has no ragged-all-to-all (XLA:CPU):
`moe_jax_emulated` replaces jax.lax.ragged_all_to_all with the same exchange built from
all_to_all (each peer's rows padded to the whole operand, then placed at the offsets the
sender gave), so the engine's layout, offsets, packing, regrouping and reduction run with
checks on, on the loopback. Rows say `exchange = emulated_ragged_all_to_all`."""
from commbench.benchmarks.base import register
from commbench.benchmarks.moe import MoE
from commbench.benchmarks.moe.engines import engine
from commbench.benchmarks.moe.jax_path import JaxPath


def emulated_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
                               axis_name):
    """jax.lax.ragged_all_to_all's contract: rows input_offsets[d] .. + send_sizes[d] of
    operand go to peer d, at row output_offsets[d] of its output; the rest of output keeps
    its values."""
    import jax

    lax, jnp = jax.lax, jax.numpy
    n, rows = input_offsets.shape[0], operand.shape[0]
    j = jnp.arange(rows)
    idx = (input_offsets[:, None] + j[None, :]).reshape(-1)
    chunks = jnp.take(operand, idx, axis=0, mode="clip").reshape((n, rows) + operand.shape[1:])
    got = lax.all_to_all(chunks, axis_name, 0, 0, tiled=True)          # [source, row]
    offs = lax.all_to_all(output_offsets, axis_name, 0, 0, tiled=True)  # where each source's rows go
    sizes = lax.all_to_all(send_sizes, axis_name, 0, 0, tiled=True)
    pos = jnp.where(j[None, :] < sizes[:, None], offs[:, None] + j[None, :], output.shape[0]).reshape(-1)
    return output.at[pos].set(got.reshape((n * rows,) + operand.shape[1:]), mode="drop")


@register
class MoEJaxEmulated(MoE):
    name = "moe_jax_emulated"

    def refusal(self, backend, device, params):
        return None if backend == "jax" else f"{self.name} runs on the jax backend only"

    def path(self, comm, params):
        path = JaxPath(engine(comm))
        path.engine.ragged = emulated_ragged_all_to_all
        return path
