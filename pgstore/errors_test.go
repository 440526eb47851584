package pgstore

import (
	"errors"

	"github.com/receiptstore/receipts/driver"
)

func isLeaseLost(err error) bool { return errors.Is(err, driver.ErrLeaseLost) }
