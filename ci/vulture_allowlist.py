"""Names the dead-code check (`vulture`, run by `nox -s lint`) must not report.

Every entry is used by something vulture cannot see: a framework that calls a
hook by name, or an argument kept so a call written for the original library
(WholeGraph, torchdistX, TorchShard, AdaPM) still works. Anything else vulture
reports is dead code: delete it rather than listing it here.
"""

# ruff: noqa: B018
# vulture reads attribute accesses on `_` as "used"
_ = object()

# --- pytest: module-level names and hooks it looks up by name
_.pytestmark
_.pytest_plugins
_.pytest_configure
_.pytest_collection_modifyitems
_.simulated_cluster  # a fixture, requested by name
_._distkit_cluster_for_marked_tests  # an autouse fixture
_.conversion_mode  # a fixture, requested by name
_.one_rank_group  # a fixture, requested through pytest.mark.usefixtures (hypothesis tests take no fixture arguments)
_.machine_lock  # a fixture, requested through pytest.mark.usefixtures
_.lock_untouchable  # a fixture, requested through pytest.mark.usefixtures
_.held_elsewhere  # a fixture, requested through pytest.mark.usefixtures

# --- torch: methods nn.Module / torch.compile / autograd call by name
_.extra_repr
_._should_skip_dynamo
_.anchor  # the autograd.Function input that carries the gradient to the embedding
_.set_to_none  # optimizer.zero_grad's signature

# --- fields of native structs (pybind11 classes) the extension reads
_.centers64  # wholemem SampleArgs
_.col64
_.weights64
_.weight_offsets

# --- attributes read through __dict__ (so torch's __torch_function__ machinery never sees them)
_._distx_mat

# --- nn.Module submodules registered by assignment (their parameters are the point)
_.ln1
_.ln2
_.qkv
_.fc
_.wpe
_.blocks
_.ln_f
_.GPT  # built by bench_deferred.py, which imports it by bare module name

# --- torch.distributed.checkpoint: StorageWriter / StorageReader hooks
_.set_up_storage_writer
_.set_up_storage_reader
_.prepare_local_plan
_.prepare_global_plan
_.write_data
_.read_data
_.validate_checkpoint_id
_.load_id

# --- torch_geometric: FeatureStore / GraphStore hooks
_._put_tensor
_._get_tensor
_._remove_tensor
_._get_tensor_size
_._put_edge_index
_._get_edge_index
_._remove_edge_index

# --- the originals' signatures, kept so their callers run unchanged
_.coordinator_rank  # torchdistX / DCP save/load
_.tensor_contents  # torch.Tensor.__repr__
_.old_elem  # the set_data callback's argument
_.part_count  # WholeGraph create_wm_tensor_from_file
_.wm_csr_row_ptr_tensor  # WholeGraph sampling ops
_.wm_csr_col_ptr_tensor
_.wm_csr_weight_ptr_tensor
_.reset_params  # TorchShard ParallelLinear
_.wait_replica_sync  # AdaPM's older name of Worker.wait_sync

# --- module __getattr__ (PEP 562) and mpiad's torch.library registrations (`_` by convention)
_.__getattr__
_._

# --- nox: sessions and options it reads by name
_.default_venv_backend
_.sessions
_.error_on_missing_interpreters
