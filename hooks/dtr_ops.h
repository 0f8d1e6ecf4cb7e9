// The custom ops torch.ops.dtr.* (stats, set_budget, budget, reset_peak, is_active, pin, unpin, expose,
// unevictable_at_peak):
// dtr's control surface from Python and C++, over g_engine.
#ifndef DTR_HOOKS_DTR_OPS_H_
#define DTR_HOOKS_DTR_OPS_H_

namespace dtr::hooks {

// Defines the dtr:: operator library. Once per process.
void RegisterDtrOps();

}  // namespace dtr::hooks

#endif  // DTR_HOOKS_DTR_OPS_H_
