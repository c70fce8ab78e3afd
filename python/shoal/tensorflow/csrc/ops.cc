// The TensorFlow ops: their signatures and shape functions. The kernels are
// in kernels_collective.cc and kernels_p2p.cc. Every op is stateful (see
// adapter.h: that is what orders them) and takes the group it runs on as the
// attribute `group` (0: the world; shoal.tensorflow.new_group makes others).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

using tensorflow::shape_inference::InferenceContext;

namespace {

tensorflow::Status same_shapes(InferenceContext* c) {
  for (int i = 0; i < c->num_inputs() && i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
  return tensorflow::Status();
}

// The first dimension unknown (it depends on the other ranks), the rest as the input's.
tensorflow::Status first_dim_unknown(InferenceContext* c) {
  tensorflow::shape_inference::ShapeHandle in = c->input(0), out;
  if (!c->RankKnown(in)) {
    c->set_output(0, c->UnknownShape());
    return tensorflow::Status();
  }
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(in, 1, &in));
  TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
  c->set_output(0, out);
  return tensorflow::Status();
}

}  // namespace

#define SHOAL_TYPES "{half, bfloat16, float, double, int8, uint8, int32, int64, bool}"

REGISTER_OP("ShoalAllreduce")
    .Input("tensors: T")
    .Output("reduced: T")
    .Attr("T: list(" SHOAL_TYPES ")")
    .Attr("reduce_op: {'sum', 'avg', 'min', 'max', 'prod'} = 'sum'")
    .Attr("fusion_bytes: int = 67108864")
    .Attr("group: int = 0")
    .SetIsStateful()
    .SetShapeFn(same_shapes)
    .Doc("Reduces every tensor across the group's ranks; tensors of one dtype travel fused, "
         "in buckets of up to fusion_bytes, one collective per bucket.");

REGISTER_OP("ShoalAllgather")
    .Input("tensor: T")
    .Output("gathered: T")
    .Attr("T: " SHOAL_TYPES)
    .Attr("group: int = 0")
    .SetIsStateful()
    .SetShapeFn(first_dim_unknown)
    .Doc("Concatenates every rank's tensor along the first dimension, in rank order; the "
         "first dimensions may differ, the others must agree.");

REGISTER_OP("ShoalBroadcast")
    .Input("tensor: T")
    .Output("broadcast: T")
    .Attr("T: " SHOAL_TYPES)
    .Attr("root: int = 0")
    .Attr("group: int = 0")
    .SetIsStateful()
    .SetShapeFn(same_shapes);

REGISTER_OP("ShoalAlltoall")
    .Input("tensor: T")
    .Input("splits: int64")
    .Output("received: T")
    .Output("received_splits: int64")
    .Attr("T: " SHOAL_TYPES)
    .Attr("group: int = 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(first_dim_unknown(c));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return tensorflow::Status();
    })
    .Doc("Sends rows splits[k] of the tensor (in order) to rank k and concatenates what "
         "arrives in rank order; empty splits: equal parts.");

REGISTER_OP("ShoalReduceScatter")
    .Input("tensor: T")
    .Output("reduced: T")
    .Attr("T: " SHOAL_TYPES)
    .Attr("reduce_op: {'sum', 'avg', 'min', 'max', 'prod'} = 'sum'")
    .Attr("group: int = 0")
    .SetIsStateful()
    .SetShapeFn(first_dim_unknown)
    .Doc("Reduces the tensors across ranks and gives rank k the k-th part of the first "
         "dimension (N // size rows, one more for the first N % size ranks).");

REGISTER_OP("ShoalBarrier")
    .Attr("group: int = 0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs);

REGISTER_OP("ShoalSend")
    .Input("tensor: T")
    .Input("peer: int32")
    .Input("tag: int64")
    .Attr("T: " SHOAL_TYPES)
    .Attr("group: int = 0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Sends the tensor (its shape and dtype with it) to rank `peer` of the group; completes "
         "once issued (ShoalWaitSends waits for the bytes to leave).");

REGISTER_OP("ShoalWaitSends")
    .Attr("group: int = 0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Waits for the group's sends issued so far; fails with the first failure among them.");

REGISTER_OP("ShoalRecv")
    .Input("peer: int32")
    .Input("tag: int64")
    .Output("tensor: T")
    .Attr("T: " SHOAL_TYPES)
    .Attr("group: int = 0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::UnknownShape)
    .Doc("Receives the tensor rank `peer` sent with ShoalSend and the same tag.");
