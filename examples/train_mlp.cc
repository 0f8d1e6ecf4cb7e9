// A plain LibTorch C++ training program linked against dtr (examples/CMakeLists.txt,
// find_package(dtr)): with DTR_BUDGET set it trains under dtr, with no other change; the same
// binary also runs under LD_PRELOAD=$(python -m dtr --print-lib). Prints one line per step with
// the loss in full precision and a checksum of the parameters, so runs with and without dtr can
// be compared bit for bit (tests/python/test_cpp_example.py), then dtr's stats on stderr.
#include <cstdio>

#include <dtr/dtr.h>
#include <torch/torch.h>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(64, 256), torch::nn::ReLU(), torch::nn::Linear(256, 256),
                              torch::nn::ReLU(), torch::nn::Linear(256, 256), torch::nn::ReLU(),
                              torch::nn::Linear(256, 10));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < 4; ++step) {
    torch::Tensor x = torch::randn({512, 64});
    torch::Tensor y = torch::randint(0, 10, {512});
    optimizer.zero_grad();
    torch::Tensor loss = torch::nll_loss(torch::log_softmax(model->forward(x), 1), y);
    loss.backward();
    optimizer.step();
    std::printf("step %d loss %.9g\n", step, loss.item<double>());
  }
  double checksum = 0;
  for (const torch::Tensor& p : model->parameters()) checksum += p.sum().item<double>();
  std::printf("param checksum %.17g\n", checksum);
  std::fprintf(stderr, "dtr active: %d stats: %s\n", dtr_is_active(), dtr_stats_json());
  return 0;
}
