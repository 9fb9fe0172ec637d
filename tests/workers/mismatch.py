"""Worker: issue collectives of different shapes on two ranks. Under
TORCH_DISTRIBUTED_DEBUG=DETAIL this must fail loudly: it shows the order check has teeth."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
group = dist.new_group()
rank = dist.get_rank()
first, second = (torch.zeros(4), torch.zeros(8)) if rank == 0 else (torch.zeros(8), torch.zeros(4))
dist.all_reduce(first, group=group, async_op=True).wait()
dist.all_reduce(second, group=group, async_op=True).wait()
dist.destroy_process_group()
