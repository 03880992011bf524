package fix

type StoreCoordinator struct {
	events []string
}

func (c *StoreCoordinator) emit(e string) { c.events = append(c.events, e) }
