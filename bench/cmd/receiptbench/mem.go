package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
)

func runMem(ctx context.Context, cfg *config) error {
	return errors.New("not yet")
}

var _ = fmt.Sprint
var _ = filepath.Join
