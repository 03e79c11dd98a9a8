#include <stdio.h>

#include "fib.h"

int main(void)
{
	printf("fib(90)=%llu\n", fib(90));
	return 0;
}
