// The header checks are done when this program links; running it says so.
#include <cstdio>

int main() {
  std::puts("every public header compiles on its own");
  return 0;
}
